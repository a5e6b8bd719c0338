import { useState } from 'react';
import { Alert, App, Button, Descriptions, Drawer, Form, Input, Modal, Space, Switch, Table, Tag, Timeline, Typography } from 'antd';
import { HistoryOutlined, SearchOutlined, StopOutlined, UndoOutlined } from '@ant-design/icons';
import { useSearchParams } from 'react-router-dom';
import { ApiError, client, ok, type UserCoupon, type UserCouponStatus } from '../api';
import { CampaignRef } from '../CampaignRef';
import { showApiErrors } from '../apiForm';
import { time } from '../format';
import { useActionsPin, useDialog, useIdempotencyKey, usePagedList, usePoll } from '../hooks';
import { label, logReason, useI18n, userCouponStatus, type Translate } from '../i18n';
import { LoadMore } from '../LoadMore';
import { OutcomeAlert, useOutcome } from '../outcome';
import { PageCard } from '../PageCard';

// LOCKED (a checkout hold) is named here before the API's document has it.
/** A timeline step by where it leads; the step where the log breaks is red whatever it leads to. */
const STEP_COLOR: Partial<Record<UserCouponStatus, string>> = { VOID: 'red', USED: 'blue', UNUSED: 'green' };

const STATUS_COLOR: Record<UserCouponStatus | 'LOCKED', string> = {
  UNUSED: 'green',
  LOCKED: 'gold',
  USED: 'blue',
  EXPIRED: 'default',
  VOID: 'red',
};

export function StatusTag({ status, t }: { status: UserCouponStatus; t: Translate }) {
  return <Tag color={STATUS_COLOR[status]}>{userCouponStatus(t, status)}</Tag>;
}

function HistoryDrawer({ userCouponId, onClose }: { userCouponId: string | null; onClose(): void }) {
  const { t } = useI18n();
  const history = usePoll(
    async () =>
      userCouponId ? ok(client.GET('/admin/user-coupons/{userCouponId}/history', { params: { path: { userCouponId } } })) : null,
    [userCouponId],
  );
  const h = history.data;
  const brokenStep = h?.firstInconsistentStep != null ? h.transitions[h.firstInconsistentStep] : undefined;
  return (
    <Drawer title={userCouponId ? t('historyOf', { id: userCouponId }) : ''} size={620} open={userCouponId !== null} onClose={onClose}>
      {history.error && <Alert type="error" title={history.error.message} />}
      {h && (
        <Space orientation="vertical" size="large" style={{ width: '100%' }} data-testid="history">
          <Alert
            type={h.consistent ? 'success' : 'error'}
            showIcon
            title={h.consistent ? t('consistent') : t('inconsistent')}
            description={
              h.consistent
                ? t('replayOk', { status: userCouponStatus(t, h.userCoupon.status) })
                : brokenStep
                  ? t('replayBroken', {
                      n: (h.firstInconsistentStep ?? 0) + 1,
                      from: brokenStep.from ? userCouponStatus(t, brokenStep.from) : t('issuance'),
                      to: userCouponStatus(t, brokenStep.to),
                      replayed: h.replayedStatus ? userCouponStatus(t, h.replayedStatus) : '—',
                    })
                  : t('replayedStatus', {
                      replayed: h.replayedStatus ? userCouponStatus(t, h.replayedStatus) : '—',
                      status: userCouponStatus(t, h.userCoupon.status),
                    })
            }
            data-testid="history-consistency"
          />
          {/* Labels on one line: in Chinese at the drawer's width, 发放时间 broke as 发放时/间. */}
          <Descriptions size="small" column={2} bordered styles={{ label: { whiteSpace: 'nowrap' } }}>
            <Descriptions.Item label={t('userId')}>{h.userCoupon.userId}</Descriptions.Item>
            <Descriptions.Item label={t('couponId')}>
              <CampaignRef id={h.userCoupon.couponId} />
            </Descriptions.Item>
            <Descriptions.Item label={t('status')}>
              <StatusTag status={h.userCoupon.status} t={t} />
            </Descriptions.Item>
            <Descriptions.Item label={t('source')}>{label(t, h.userCoupon.source)}</Descriptions.Item>
            <Descriptions.Item label={t('issuedAt')}>{time(h.userCoupon.issuedAt)}</Descriptions.Item>
            <Descriptions.Item label={t('expiresAt')}>{time(h.userCoupon.expiresAt)}</Descriptions.Item>
          </Descriptions>
          <Timeline
            data-testid="timeline"
            items={h.transitions.map((step, i) => ({
              color: i === h.firstInconsistentStep ? 'red' : (STEP_COLOR[step.to] ?? 'gray'),
              title: time(step.at),
              content: (
                <div>
                  <Space>
                    {step.from ? <StatusTag status={step.from} t={t} /> : <Tag>{t('issuance')}</Tag>}
                    <span>→</span>
                    <StatusTag status={step.to} t={t} />
                  </Space>
                  {i === h.firstInconsistentStep && (
                    <div style={{ marginTop: 4 }} data-testid="broken-step">
                      <Typography.Text type="danger">{t('brokenStep')}</Typography.Text>
                    </div>
                  )}
                  {step.reason && <div style={{ marginTop: 4 }}>{logReason(t, step.reason)}</div>}
                  <Typography.Text type="secondary" code style={{ fontSize: 12 }}>
                    {t('txId')}: {step.txId}
                  </Typography.Text>
                </div>
              ),
            }))}
          />
        </Space>
      )}
    </Drawer>
  );
}

type Action = { kind: 'void'; coupon: UserCoupon } | { kind: 'reissue'; coupon: UserCoupon | null };

function ActionModal({
  action,
  open,
  userId,
  onClose,
  afterClose,
  onDone,
  onStale,
}: {
  action: Action | null;
  open: boolean;
  userId: string;
  onClose(): void;
  afterClose(): void;
  onDone(): void;
  /** Refused for the coupon's state (held, used or replaced meanwhile): the list shows an older one. */
  onStale(): void;
}) {
  const { t } = useI18n();
  const { message } = App.useApp();
  const [form] = Form.useForm<{ reason: string; couponId?: string; fromStock: boolean }>();
  const [busy, setBusy] = useState(false);
  const [refusal, setRefusal] = useState<string | null>(null);
  const outcome = useOutcome();
  const [key, renewKey] = useIdempotencyKey();
  if (!action) return null;
  const title = action.kind === 'void' ? t('confirmVoid', { id: action.coupon.id }) : t('reissue');
  return (
    <Modal
      title={title}
      open={open}
      onCancel={onClose}
      afterClose={afterClose}
      onOk={() => form.submit()}
      okText={action.kind === 'void' ? t('voidIt') : t('reissue')}
      okButtonProps={{ danger: action.kind === 'void', loading: busy, 'data-testid': 'action-submit' }}
      destroyOnHidden
    >
      <OutcomeAlert unsure={outcome.unsure} />
      {refusal && <Alert type="error" showIcon title={refusal} style={{ marginBottom: 16 }} />}
      <Form
        form={form}
        layout="vertical"
        initialValues={{ fromStock: false, couponId: action.coupon?.couponId }}
        onValuesChange={renewKey}
        onFinish={async (v) => {
          setBusy(true);
          setRefusal(null);
          outcome.reset();
          try {
            if (action.kind === 'void') {
              await ok(
                client.POST('/admin/user-coupons/{userCouponId}/void', {
                  params: { path: { userCouponId: action.coupon.id } },
                  body: { reason: v.reason },
                }),
              );
              void message.success(t('voided', { id: action.coupon.id }));
            } else {
              const issued = await ok(
                client.POST('/admin/user-coupons/reissue', {
                  body: {
                    couponId: v.couponId as string,
                    userId,
                    reason: v.reason,
                    fromStock: v.fromStock,
                    ...(action.coupon ? { replacesUserCouponId: action.coupon.id } : {}),
                  },
                  // A double click or a retried request reissues once.
                  headers: { 'idempotency-key': key },
                }),
              );
              void message.success(t('reissued', { id: issued.id, user: userId }));
              renewKey();
            }
            onDone();
          } catch (err) {
            // Maybe made: the key is kept, so Reissue pressed again reissues once.
            if (outcome.failed(err)) return;
            if (err instanceof ApiError && err.status === 409) onStale();
            const rest = showApiErrors(form, err, [['reason'], ['couponId'], ['fromStock']]);
            if (rest) setRefusal(rest);
          } finally {
            setBusy(false);
          }
        }}
      >
        {action.kind === 'reissue' && (
          <>
            <Form.Item name="couponId" label={t('couponId')} rules={[{ required: true, message: t('required') }]}>
              <Input disabled={action.coupon !== null} />
            </Form.Item>
            {action.coupon && (
              <Typography.Paragraph type="secondary">
                {t('replaces')} #{action.coupon.id}
              </Typography.Paragraph>
            )}
            <Form.Item name="fromStock" label={t('fromStock')} valuePropName="checked">
              <Switch />
            </Form.Item>
          </>
        )}
        <Form.Item name="reason" label={t('reason')} rules={[{ required: true, whitespace: true, message: t('reasonRequired') }]}>
          <Input.TextArea rows={2} data-testid="action-reason" />
        </Form.Item>
      </Form>
    </Modal>
  );
}

export function UserCoupons() {
  const { t } = useI18n();
  const actionsPin = useActionsPin();
  const [params, setParams] = useSearchParams();
  const userId = params.get('userId') ?? '';
  const historyOf = params.get('history');
  const action = useDialog<Action>();
  const list = usePagedList(
    async (cursor) =>
      userId
        ? ok(client.GET('/admin/user-coupons', { params: { query: { userId, limit: 100, cursor } } }))
        : { items: [], nextCursor: null },
    [userId],
  );
  // The list runs newest first, so a replacement is always read before the coupon it replaces.
  const replacedBy = new Map(
    (list.items ?? []).filter((uc) => uc.replacesUserCouponId !== null).map((uc) => [uc.replacesUserCouponId, uc.id]),
  );
  // A user id the service refused names no user: no "Coupons of a b", no "no coupons", no Reissue for it.
  const shown = userId && !(list.error instanceof ApiError && list.error.status === 400) ? userId : '';
  const setParam = (k: string, v: string | null) => {
    const next = new URLSearchParams(params);
    if (v === null) next.delete(k);
    else next.set(k, v);
    setParams(next);
  };

  return (
    <PageCard
      title={shown ? t('userCouponsOf', { user: shown }) : t('navUsers')}
      extra={
        shown && (
          <Button icon={<UndoOutlined />} onClick={() => action.show({ kind: 'reissue', coupon: null })}>
            {t('reissue')}
          </Button>
        )
      }
    >
      <Input.Search
        key={userId}
        defaultValue={userId}
        placeholder={t('userId')}
        aria-label={t('userId')}
        enterButton={
          <>
            <SearchOutlined /> {t('search')}
          </>
        }
        style={{ maxWidth: 420, marginBottom: 16 }}
        onSearch={(v) => setParams(v.trim() ? { userId: v.trim() } : {})}
        data-testid="user-search"
      />
      {list.error && <Alert type="error" title={list.error.message} style={{ marginBottom: 16 }} />}
      {!shown ? (
        !userId && <Typography.Paragraph type="secondary">{t('enterUserId')}</Typography.Paragraph>
      ) : (
        <Table<UserCoupon>
          rowKey="id"
          // The widths' sum: a time keeps its two lines (date and time, then zone) rather than three.
          scroll={{ x: 1190 }}
          size="middle"
          loading={list.loading}
          dataSource={list.items}
          pagination={false}
          locale={{ emptyText: t('noUserCoupons') }}
          columns={[
            { title: t('id'), dataIndex: 'id', width: 80 },
            {
              title: t('couponId'),
              dataIndex: 'couponId',
              width: 90,
              // The campaign's page names it (and the link's title): an operator answering "my 满100减50 coupon" finds which row is which.
              render: (id: string) => <CampaignRef id={id} compact />,
            },
            { title: t('status'), dataIndex: 'status', width: 100, render: (s: UserCouponStatus) => <StatusTag status={s} t={t} /> },
            {
              title: t('source'),
              dataIndex: 'source',
              width: 150,
              render: (source: string, uc) =>
                uc.replacesUserCouponId === null ? (
                  label(t, source)
                ) : (
                  <Space orientation="vertical" size={0}>
                    {label(t, source)}
                    <Typography.Text type="secondary" style={{ fontSize: 12 }}>
                      {t('replacesCoupon', { id: uc.replacesUserCouponId })}
                    </Typography.Text>
                  </Space>
                ),
            },
            { title: t('issuedAt'), dataIndex: 'issuedAt', width: 170, render: time },
            { title: t('expiresAt'), dataIndex: 'expiresAt', width: 170, render: time },
            { title: t('usedAt'), dataIndex: 'usedAt', width: 170, render: time },
            {
              title: t('actions'),
              key: 'actions',
              width: 260,
              // In view however far the table scrolls: at 1280 pixels Void was cut off at the card's edge.
              fixed: actionsPin,
              render: (_, uc) => (
                <Space size={4}>
                  <Button
                    size="small"
                    icon={<HistoryOutlined />}
                    onClick={() => setParam('history', uc.id)}
                    data-testid={`history-${uc.id}`}
                  >
                    {t('history')}
                  </Button>
                  <Button
                    size="small"
                    danger
                    icon={<StopOutlined />}
                    // A held (LOCKED) coupon cannot be voided either: the API answers COUPON_LOCKED until its order lets it go.
                    disabled={uc.status === 'USED' || uc.status === 'VOID' || uc.status === 'LOCKED'}
                    title={uc.status === 'LOCKED' ? t('voidLockedHint') : undefined}
                    onClick={() => action.show({ kind: 'void', coupon: uc })}
                    data-testid={`void-${uc.id}`}
                  >
                    {t('voidIt')}
                  </Button>
                  {/* A replacement is for a coupon the user can no longer use: one for a usable coupon would give two. */}
                  <Button
                    size="small"
                    disabled={uc.status === 'UNUSED' || uc.status === 'LOCKED' || replacedBy.has(uc.id)}
                    title={
                      uc.status === 'UNUSED' || uc.status === 'LOCKED'
                        ? t('reissueUsableHint')
                        : replacedBy.has(uc.id)
                          ? t('replacedAlreadyHint', { id: replacedBy.get(uc.id) as string })
                          : undefined
                    }
                    onClick={() => action.show({ kind: 'reissue', coupon: uc })}
                    data-testid={`reissue-${uc.id}`}
                  >
                    {t('reissue')}
                  </Button>
                </Space>
              ),
            },
          ]}
        />
      )}
      <LoadMore list={list} />
      {/* A form per action (its own Idempotency-Key), not one kept across them. */}
      <ActionModal
        key={action.of ? `${action.of.kind}-${action.of.coupon?.id ?? 'new'}` : 'none'}
        action={action.of}
        open={action.open}
        userId={userId}
        onClose={action.close}
        afterClose={action.afterClose}
        onDone={() => {
          const voided = action.of?.kind === 'void' ? action.of.coupon.id : null;
          action.close();
          void list.reload();
          if (voided) setParam('history', voided);
        }}
        onStale={() => void list.reload()}
      />
      <HistoryDrawer userCouponId={historyOf} onClose={() => setParam('history', null)} />
    </PageCard>
  );
}
