import { CampaignRef } from '../CampaignRef';
import { useState } from 'react';
import { Alert, App, Button, Descriptions, Form, Input, Modal, Space, Table, Tag, Typography } from 'antd';
import { CheckOutlined, CloseOutlined } from '@ant-design/icons';
import { Link } from 'react-router-dom';
import { ApiError, client, ok, type Compensation } from '../api';
import { showApiErrors } from '../apiForm';
import { time, valueText } from '../format';
import { useDialog, type PagedList } from '../hooks';
import { explanationText, keyLabel, label, useI18n, type MessageKey, type Translate } from '../i18n';
import { LoadMore } from '../LoadMore';
import { OutcomeAlert, useOutcome } from '../outcome';

const STATUS_COLOR = { PENDING: 'gold', DONE: 'green', REJECTED: 'default' } as const;

/** Keys whose values are the API's codes (statuses, operations), shown by their names. */
const CODE_KEYS = new Set(['status', 'replayedStatus', 'targetStatus', 'releaseTo', 'closeAs', 'done', 'from', 'to', 'op']);
/** `result.done` of a decision that changed nothing: the API writes a sentence, held here to the OpenAPI document's list. */
type Done = NonNullable<Compensation['result']>['done'];
const DONE_NOTHING: Record<Extract<Done, `nothing: ${string}`>, MessageKey> = {
  'nothing: rejected': 'doneNothingRejected',
  'nothing: approved as reviewed; the data was not changed by this compensation': 'doneNothingReviewed',
};
/** A value of that JSON in words, as the rest of the console shows it: times in the operator's zone, amounts in yuan. */
function scalarText(t: Translate, key: string, v: string | number | boolean): string {
  if (typeof v === 'boolean') return t(v ? 'yes' : 'no');
  if (key === 'done' && typeof v === 'string' && Object.hasOwn(DONE_NOTHING, v)) return t(DONE_NOTHING[v as keyof typeof DONE_NOTHING]);
  return typeof v === 'string' && CODE_KEYS.has(key) ? label(t, v) : valueText(key, v);
}

/** Fields of a log row a repair will append that are left empty for the approval to fill in (its transaction id, reason and time). */
const FILLED_ON_APPROVAL = new Set(['txId', 'reason', 'createdAt']);

function Value({ name, value, within }: { name: string; value: unknown; within?: string }) {
  const { t } = useI18n();
  if (value === null && within === 'rows' && FILLED_ON_APPROVAL.has(name))
    return <Typography.Text type="secondary">{t('filledOnApproval')}</Typography.Text>;
  // An empty list is "none" as much as null is: `[]` meant nothing to an operator.
  if (value === null || value === undefined || (Array.isArray(value) && value.length === 0))
    return <Typography.Text type="secondary">—</Typography.Text>;
  if (Array.isArray(value)) {
    if (value.every((v) => typeof v !== 'object' || v === null))
      return <>{value.map((v) => (v === null ? '—' : scalarText(t, name, v as string | number | boolean))).join(', ')}</>;
    return (
      <Space orientation="vertical" style={{ width: '100%' }}>
        {value.map((v, i) => (
          <JsonView key={i} value={v} within={name} nested />
        ))}
      </Space>
    );
  }
  if (typeof value === 'object') return <JsonView value={value} nested />;
  return <>{scalarText(t, name, value as string | number | boolean)}</>;
}

/**
 * JSON the reconciliation wrote (details, params, results) as readable key/value lines. Nested ones
 * put their labels above their values: beside them, three levels deep (a repair's steps, a step's
 * log rows), the words of the innermost were broken one letter a line.
 */
export function JsonView({ value, within, nested = false }: { value: unknown; within?: string; nested?: boolean }) {
  const { t } = useI18n();
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return <Value name="" value={value} />;
  return (
    <Descriptions
      size="small"
      column={1}
      bordered
      layout={nested ? 'vertical' : 'horizontal'}
      styles={{ label: { width: nested ? undefined : 150 } }}
    >
      {Object.entries(value as Record<string, unknown>).map(([k, v]) => (
        <Descriptions.Item key={k} label={keyLabel(t, k)}>
          <Value name={k} value={v} within={within} />
        </Descriptions.Item>
      ))}
    </Descriptions>
  );
}

/** The action's parameters the details do not already show with the same value (most repeat them). */
function beyondDetails(params: unknown, details: unknown): unknown {
  if (typeof params !== 'object' || params === null || typeof details !== 'object' || details === null) return params;
  const shown = details as Record<string, unknown>;
  const rest = Object.entries(params).filter(([k, v]) => JSON.stringify(shown[k]) !== JSON.stringify(v));
  return rest.length > 0 ? Object.fromEntries(rest) : null;
}

/** The details as shown: the explanation in the console's language, without the sentences it was said from. */
function shownDetails(details: unknown, t: Translate): unknown {
  if (typeof details !== 'object' || details === null || !('explanationParts' in details)) return details;
  const { explanationParts: _, ...rest } = details as Record<string, unknown>;
  return { ...rest, explanation: explanationText(t, details) };
}

function Decide({
  decision,
  compensation,
  open,
  onClose,
  afterClose,
  onDone,
  onStale,
}: {
  decision: 'approve' | 'reject';
  compensation: Compensation;
  open: boolean;
  onClose(): void;
  afterClose(): void;
  onDone(): void;
  onStale(): void;
}) {
  const { t } = useI18n();
  const { message } = App.useApp();
  const [form] = Form.useForm<{ reason: string }>();
  const [busy, setBusy] = useState(false);
  const [refusal, setRefusal] = useState<string | null>(null);
  const outcome = useOutcome();
  const done = () => {
    void message.success(t(decision === 'approve' ? 'approved' : 'rejected', { id: compensation.id }));
    onDone();
  };
  return (
    <Modal
      open={open}
      afterClose={afterClose}
      title={
        decision === 'approve'
          ? t('approveTitle', { id: compensation.id, action: label(t, compensation.action) })
          : t('rejectTitle', { id: compensation.id })
      }
      onCancel={onClose}
      onOk={() => form.submit()}
      okText={t(decision)}
      okButtonProps={{ danger: decision === 'reject', loading: busy, 'data-testid': 'decide-submit' }}
      width={720}
      destroyOnHidden
    >
      <OutcomeAlert unsure={outcome.unsure} />
      {refusal && <Alert type="error" showIcon title={refusal} style={{ marginBottom: 16 }} />}
      <Typography.Paragraph type="secondary">{t('action')}:</Typography.Paragraph>
      <JsonView value={compensation.params} />
      <Form
        form={form}
        layout="vertical"
        style={{ marginTop: 16 }}
        onFinish={async ({ reason }) => {
          // This dialog's last press may have decided it: its answer was lost.
          const maybeDecided = outcome.unsure !== null;
          setBusy(true);
          setRefusal(null);
          outcome.reset();
          try {
            const decide = { params: { path: { id: compensation.id } }, body: { reason } };
            await ok(
              decision === 'approve'
                ? client.POST('/admin/compensations/{id}/approve', decide)
                : client.POST('/admin/compensations/{id}/reject', decide),
            );
            done();
          } catch (err) {
            if (outcome.failed(err)) return;
            const alreadyDecided = err instanceof ApiError && err.code === 'COMPENSATION_ALREADY_DECIDED';
            // A decision has no Idempotency-Key: pressed again after a lost answer, the one that was
            // made is refused as already made. Made as this dialog asks, what the operator wanted
            // holds: told so as if the first answer had come, not shown an error.
            if (alreadyDecided && maybeDecided && err.details?.status === (decision === 'approve' ? 'DONE' : 'REJECTED')) return done();
            const rest = showApiErrors(form, err, [['reason']]);
            if (rest) setRefusal(rest);
            // Decided elsewhere meanwhile: the list behind the dialog shows how.
            if (alreadyDecided) onStale();
          } finally {
            setBusy(false);
          }
        }}
      >
        <Form.Item name="reason" label={t('reason')} rules={[{ required: true, whitespace: true, message: t('reasonRequired') }]}>
          <Input.TextArea rows={2} data-testid="decide-reason" />
        </Form.Item>
      </Form>
    </Modal>
  );
}

/** The compensations `list` has read, a "load more" under them while the API has more. */
export function CompensationTable({ list }: { list: PagedList<Compensation> }) {
  const { t } = useI18n();
  const deciding = useDialog<{ decision: 'approve' | 'reject'; compensation: Compensation }>();
  return (
    <>
      {/* A list that failed to load must not read as "nothing pending". */}
      {list.error && <Alert type="error" title={list.error.message} style={{ marginBottom: 16 }} />}
      <Table<Compensation>
        rowKey="id"
        scroll={{ x: 900 }}
        size="middle"
        loading={list.loading && !list.items}
        dataSource={list.items}
        pagination={false}
        locale={{ emptyText: t('noCompensations') }}
        expandable={{
          expandRowByClick: true,
          expandedRowRender: (c) => (
            <Space orientation="vertical" style={{ width: '100%' }}>
              <Typography.Text strong>{t('details')}</Typography.Text>
              <JsonView value={shownDetails(c.discrepancy.details, t)} />
              <Typography.Text strong>{t('action')}</Typography.Text>
              <JsonView value={beyondDetails(c.params, c.discrepancy.details)} />
              {c.result !== null && (
                <>
                  <Typography.Text strong>{t('whatWasDone')}</Typography.Text>
                  <JsonView value={c.result} />
                </>
              )}
            </Space>
          ),
        }}
        columns={[
          { title: t('id'), dataIndex: 'id', width: 60 },
          {
            title: t('discrepancy'),
            key: 'type',
            render: (_, c) => {
              const why = explanationText(t, c.discrepancy.details);
              return (
                <Space orientation="vertical" size={0}>
                  <Tag color="volcano" title={c.discrepancy.type}>
                    {label(t, c.discrepancy.type)}
                  </Tag>
                  <Typography.Text type="secondary" style={{ fontSize: 12 }}>
                    <Link to={`/reconciliation/${c.discrepancy.runId}`} onClick={(e) => e.stopPropagation()}>
                      {t('run', { id: c.discrepancy.runId })}
                    </Link>
                    {c.discrepancy.couponId && (
                      <>
                        {` · ${t('couponId')} `}
                        <CampaignRef id={c.discrepancy.couponId} />
                      </>
                    )}
                    {c.discrepancy.userCouponId && ` · ${t('key_userCouponId')} #${c.discrepancy.userCouponId}`}
                  </Typography.Text>
                  {why && <Typography.Text>{why}</Typography.Text>}
                </Space>
              );
            },
          },
          { title: t('action'), dataIndex: 'action', width: 160, render: (a: string) => <Tag title={a}>{label(t, a)}</Tag> },
          {
            title: t('status'),
            dataIndex: 'status',
            width: 100,
            // An approved review changed no data: "Done" read as though something was fixed.
            render: (s: Compensation['status'], c: Compensation) => (
              <Tag color={STATUS_COLOR[s]} title={s}>
                {label(t, s === 'DONE' && c.action === 'MANUAL_REVIEW' ? 'REVIEWED' : s)}
              </Tag>
            ),
          },
          {
            title: t('decided'),
            key: 'decided',
            render: (_, c) =>
              c.decidedAt ? (
                <Space orientation="vertical" size={0}>
                  <span>{time(c.decidedAt)}</span>
                  <Typography.Text type="secondary" style={{ fontSize: 12 }}>
                    {t('decidedBy', { who: c.decidedBy ?? '?', reason: c.decisionReason ?? '' })}
                  </Typography.Text>
                </Space>
              ) : (
                '—'
              ),
          },
          {
            title: t('actions'),
            key: 'actions',
            width: 200,
            render: (_, c) =>
              c.status === 'PENDING' && (
                <Space size={4} onClick={(e) => e.stopPropagation()}>
                  <Button
                    size="small"
                    type="primary"
                    icon={<CheckOutlined />}
                    onClick={() => deciding.show({ decision: 'approve', compensation: c })}
                    data-testid={`approve-${c.id}`}
                  >
                    {t('approve')}
                  </Button>
                  <Button
                    size="small"
                    danger
                    icon={<CloseOutlined />}
                    onClick={() => deciding.show({ decision: 'reject', compensation: c })}
                    data-testid={`reject-${c.id}`}
                  >
                    {t('reject')}
                  </Button>
                </Space>
              ),
          },
        ]}
      />
      {deciding.of && (
        <Decide
          // A dialog opened for another one while this one closed starts with an empty form.
          key={`${deciding.of.decision}-${deciding.of.compensation.id}`}
          {...deciding.of}
          open={deciding.open}
          onClose={deciding.close}
          afterClose={deciding.afterClose}
          onDone={() => {
            deciding.close();
            void list.reload();
          }}
          onStale={() => void list.reload()}
        />
      )}
      <LoadMore list={list} />
    </>
  );
}
