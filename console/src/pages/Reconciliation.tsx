import { useState } from 'react';
import { Alert, App, Button, Card, Col, Descriptions, Empty, Row, Select, Space, Statistic, Table, Tag, Typography } from 'antd';
import { ArrowLeftOutlined, PlayCircleOutlined } from '@ant-design/icons';
import { Link, useNavigate, useParams } from 'react-router-dom';
import { client, ok, type Run } from '../api';
import { count, time, yuan } from '../format';
import { usePagedList, usePoll } from '../hooks';
import { label, useI18n } from '../i18n';
import { LoadMore } from '../LoadMore';
import { NavButton } from '../NavButton';
import { PageCard } from '../PageCard';
import { CompensationTable } from './CompensationTable';

const RUN_COLOR = { RUNNING: 'processing', COMPLETED: 'success', FAILED: 'error' } as const;

/**
 * How many compensations other runs proposed are still PENDING. A run counts only the discrepancies
 * it records as new, and one whose compensation waits is not recorded again: a run finding none says
 * nothing about those. The API gives no count, so every page of them is read.
 */
async function pendingOfOtherRuns(runId: string): Promise<number> {
  let n = 0;
  let cursor: string | undefined;
  do {
    const page = await ok(client.GET('/admin/compensations', { params: { query: { status: 'PENDING', limit: 100, cursor } } }));
    n += page.items.filter((c) => c.discrepancy.runId !== runId).length;
    cursor = page.nextCursor ?? undefined;
  } while (cursor);
  return n;
}

function RunDetail({ runId }: { runId: string }) {
  const { t } = useI18n();
  const run = usePoll(() => ok(client.GET('/admin/reconciliation/runs/{runId}', { params: { path: { runId } } })), [runId], 2000);
  const compensations = usePagedList(
    (cursor) => ok(client.GET('/admin/compensations', { params: { query: { runId, limit: 100, cursor } } })),
    [runId, run.data?.status],
  );
  const pending = usePoll(() => pendingOfOtherRuns(runId), [runId, run.data?.status]);
  const r = run.data;
  const waiting = pending.data ?? 0;
  const pendingLink = <Link to="/compensations?status=PENDING">{t('openPending')}</Link>;
  return (
    <Space orientation="vertical" size="large" style={{ width: '100%' }}>
      <Space wrap>
        <NavButton to="/reconciliation" icon={<ArrowLeftOutlined />}>
          {t('back')}
        </NavButton>
        <Typography.Title level={3} style={{ margin: 0 }}>
          {t('run', { id: runId })}
        </Typography.Title>
        {r && <Tag color={RUN_COLOR[r.status]}>{label(t, r.status)}</Tag>}
      </Space>
      {run.error && <Alert type="error" title={run.error.message} />}
      {r && (
        <Card>
          <Row gutter={[16, 16]}>
            <Col xs={12} md={6}>
              <Statistic title={t('checked')} value={r.checked} />
            </Col>
            <Col xs={12} md={6}>
              <Statistic
                title={t('discrepancies')}
                value={r.discrepancies}
                styles={{ content: { color: r.discrepancies ? '#cf1322' : waiting ? '#d48806' : '#3f8600' } }}
              />
            </Col>
            <Col xs={24} md={12}>
              <Descriptions size="small" column={1}>
                <Descriptions.Item label={t('mode')}>{label(t, r.mode)}</Descriptions.Item>
                <Descriptions.Item label={t('triggeredBy')}>{r.triggeredBy}</Descriptions.Item>
                <Descriptions.Item label={t('startedAt')}>{time(r.startedAt)}</Descriptions.Item>
                <Descriptions.Item label={t('finishedAt')}>{time(r.finishedAt)}</Descriptions.Item>
              </Descriptions>
            </Col>
          </Row>
          {r.totals && (
            <Descriptions
              size="small"
              bordered
              column={{ xs: 1, md: 3 }}
              title={t('ledgerAsRead')}
              style={{ marginTop: 16 }}
              data-testid="run-totals"
            >
              <Descriptions.Item label={t('totalUserCoupons')}>{count(r.totals.userCoupons)}</Descriptions.Item>
              <Descriptions.Item label={t('totalUses')}>{count(r.totals.redemptions)}</Descriptions.Item>
              <Descriptions.Item label={t('totalDiscount')}>¥{yuan(r.totals.discountCents)}</Descriptions.Item>
              <Descriptions.Item label={t('totalRefundedUses')}>{count(r.totals.refundedRedemptions)}</Descriptions.Item>
              <Descriptions.Item label={t('totalRefundedDiscount')}>¥{yuan(r.totals.refundedDiscountCents)}</Descriptions.Item>
              <Descriptions.Item label={t('totalNetDiscount')}>
                ¥{yuan(r.totals.discountCents - r.totals.refundedDiscountCents)}
              </Descriptions.Item>
            </Descriptions>
          )}
          {r.error && <Alert type="error" title={`${t('error')}: ${r.error}`} style={{ marginTop: 16 }} />}
          <Typography.Title level={5} style={{ marginTop: 16 }}>
            {t('byType')}
          </Typography.Title>
          {r.byType && Object.keys(r.byType).length > 0 ? (
            <Space orientation="vertical">
              <Space wrap>
                {Object.entries(r.byType).map(([type, n]) => (
                  <Tag key={type} title={type} color="volcano" style={{ fontSize: 14, padding: '4px 10px' }}>
                    {label(t, type)}: {n}
                  </Tag>
                ))}
              </Space>
              {waiting > 0 && (
                <Typography.Text data-testid="pending-elsewhere">
                  {t('pendingElsewhere', { n: count(waiting) })} {pendingLink}
                </Typography.Text>
              )}
            </Space>
          ) : r.status === 'RUNNING' ? null : pending.error ? (
            <Alert type="error" title={pending.error.message} />
          ) : waiting > 0 ? (
            <Alert
              type="warning"
              showIcon
              data-testid="pending-elsewhere"
              title={t('noNewDiscrepancies', { n: count(waiting) })}
              description={
                <>
                  {t('pendingNotAgain')} {pendingLink}
                </>
              }
            />
          ) : (
            // Only once the pending ones are counted: "every table agrees" must not show while proposals wait.
            pending.data === 0 && <Typography.Text type="success">{t('noDiscrepancies')}</Typography.Text>
          )}
        </Card>
      )}
      <Card title={t('compensations')}>
        <CompensationTable list={compensations} />
      </Card>
    </Space>
  );
}

function Runs() {
  const { t } = useI18n();
  const { message } = App.useApp();
  const navigate = useNavigate();
  const [mode, setMode] = useState<Run['mode']>('FULL');
  const [starting, setStarting] = useState(false);
  const runs = usePagedList(
    (cursor) => ok(client.GET('/admin/reconciliation/runs', { params: { query: { limit: 50, cursor } } })),
    [],
    3000,
  );
  return (
    <PageCard
      title={t('runs')}
      extra={
        <Space wrap>
          <Select<Run['mode']>
            aria-label={t('mode')}
            value={mode}
            onChange={setMode}
            style={{ width: 140 }}
            options={[
              { value: 'FULL', label: t('FULL') },
              { value: 'INCREMENTAL', label: t('INCREMENTAL') },
            ]}
          />
          <Button
            type="primary"
            icon={<PlayCircleOutlined />}
            loading={starting}
            data-testid="start-run"
            onClick={async () => {
              setStarting(true);
              try {
                const { runId } = await ok(client.POST('/admin/reconciliation/runs', { body: { mode } }));
                void message.success(t('runStarted', { id: runId }));
                navigate(`/reconciliation/${runId}`);
              } catch (err) {
                void message.error((err as Error).message);
              } finally {
                setStarting(false);
              }
            }}
          >
            {t('startRun')}
          </Button>
        </Space>
      }
    >
      {runs.error && <Alert type="error" title={runs.error.message} />}
      <Table<Run>
        rowKey="id"
        scroll={{ x: 960 }}
        size="middle"
        loading={runs.loading && !runs.items}
        dataSource={runs.items}
        pagination={false}
        locale={{ emptyText: <Empty /> }}
        onRow={(r) => ({ onClick: () => navigate(`/reconciliation/${r.id}`), style: { cursor: 'pointer' } })}
        columns={[
          {
            title: t('id'),
            dataIndex: 'id',
            width: 70,
            render: (id: string) => (
              // The row navigates too: without this a click went to the page twice, and Back seemed to do nothing.
              <Link to={`/reconciliation/${id}`} onClick={(e) => e.stopPropagation()}>
                {id}
              </Link>
            ),
          },
          {
            title: t('status'),
            dataIndex: 'status',
            width: 120,
            render: (s: Run['status']) => <Tag color={RUN_COLOR[s]}>{label(t, s)}</Tag>,
          },
          { title: t('mode'), dataIndex: 'mode', width: 110, render: (m: string) => label(t, m) },
          { title: t('startedAt'), dataIndex: 'startedAt', render: time },
          { title: t('finishedAt'), dataIndex: 'finishedAt', render: time },
          { title: t('checked'), dataIndex: 'checked', align: 'right', render: (n: number) => count(n) },
          {
            title: t('discrepancies'),
            dataIndex: 'discrepancies',
            align: 'right',
            render: (n: number) =>
              n > 0 ? (
                <Typography.Text type="danger" strong>
                  {count(n)}
                </Typography.Text>
              ) : (
                n
              ),
          },
          { title: t('triggeredBy'), dataIndex: 'triggeredBy' },
        ]}
      />
      <LoadMore list={runs} />
    </PageCard>
  );
}

export function Reconciliation() {
  const { runId } = useParams();
  return runId ? <RunDetail runId={runId} /> : <Runs />;
}
