import { useState } from 'react';
import { App, Button, Input, Popconfirm, Progress, Space, Table, Tag, Tooltip, Typography } from 'antd';
import { LineChartOutlined, PauseCircleOutlined, PlayCircleOutlined, PlusOutlined, ReloadOutlined } from '@ant-design/icons';
import { Link } from 'react-router-dom';
import { client, ok, type Coupon, type Counts, type CouponView } from '../api';
import { count, phase, shortTime } from '../format';
import { useActionsPin, usePagedList } from '../hooks';
import { LoadMore } from '../LoadMore';
import { NavButton } from '../NavButton';
import { useI18n, type Translate } from '../i18n';
import { PageCard } from '../PageCard';
import { CreateCampaign } from './CreateCampaign';
import { StockModal } from './StockModal';

/** LOCKED coupons (checkout holds) are counted once the API has them. */
export const lockedCount = (counts: Counts) => (counts as Counts & { locked?: number }).locked ?? 0;

/** Counts are real counts on the server: the list refreshes every 10 s, the live page polls the cheap series instead. */
const LIST_REFRESH_MS = 10_000;

const PHASE_COLOR = { notStarted: 'default', running: 'green', ended: 'default', soldOut: 'red' } as const;

export function StatusTags({ coupon, t }: { coupon: CouponView; t: Translate }) {
  const p = phase(coupon);
  return (
    <Space size={4} wrap>
      {coupon.status === 'PAUSED' ? <Tag color="orange">{t('PAUSED')}</Tag> : <Tag color={PHASE_COLOR[p]}>{t(p)}</Tag>}
    </Space>
  );
}

export function StockBar({ coupon, t }: { coupon: Pick<CouponView, 'initStock' | 'remainingStock'>; t: Translate }) {
  const percent = coupon.initStock === 0 ? 0 : (coupon.remainingStock / coupon.initStock) * 100;
  return (
    <Tooltip title={t('remainingOf', { remaining: count(coupon.remainingStock), total: count(coupon.initStock) })}>
      <div data-testid="stock-bar" data-remaining={coupon.remainingStock}>
        <Progress
          percent={Math.round(percent * 10) / 10}
          strokeColor={percent > 50 ? '#52c41a' : percent > 15 ? '#faad14' : '#f5222d'}
          format={() => `${count(coupon.remainingStock)} / ${count(coupon.initStock)}`}
          size="small"
        />
      </div>
    </Tooltip>
  );
}

/** Pause or resume, as a button that reports what it did. Pausing stops a live sale, so it is asked first. */
export function PauseButton({ coupon, onDone }: { coupon: Pick<CouponView, 'id' | 'name' | 'status'>; onDone(c: CouponView): void }) {
  const { t } = useI18n();
  const { message } = App.useApp();
  const [busy, setBusy] = useState(false);
  const pausing = coupon.status === 'ACTIVE';
  const change = async () => {
    setBusy(true);
    try {
      const c = await ok(
        client.PATCH('/admin/coupons/{couponId}', {
          params: { path: { couponId: coupon.id } },
          body: { status: pausing ? 'PAUSED' : 'ACTIVE' },
        }),
      );
      void message.success(t(pausing ? 'paused' : 'resumed', { name: c.name }));
      onDone(c);
    } catch (err) {
      void message.error((err as Error).message);
    } finally {
      setBusy(false);
    }
  };
  // Disabled rather than left out when resuming: the button stays the same element, and keeps the focus.
  return (
    <Popconfirm
      disabled={!pausing}
      title={t('confirmPause', { name: coupon.name })}
      okText={t('pause')}
      okButtonProps={{ danger: true, 'data-testid': 'pause-confirm' }}
      onConfirm={change}
    >
      <Button
        size="small"
        loading={busy}
        icon={pausing ? <PauseCircleOutlined /> : <PlayCircleOutlined />}
        onClick={pausing ? undefined : change}
      >
        {t(pausing ? 'pause' : 'resume')}
      </Button>
    </Popconfirm>
  );
}

export function Campaigns() {
  const { t } = useI18n();
  const actionsPin = useActionsPin();
  const [creating, setCreating] = useState(false);
  const [stockOf, setStockOf] = useState<Coupon | null>(null);
  // A part of the name, or an id; none: every campaign.
  const [q, setQ] = useState<string>();
  const list = usePagedList(
    (cursor) => ok(client.GET('/admin/coupons', { params: { query: { limit: 20, cursor, q } } })),
    [q],
    LIST_REFRESH_MS,
  );

  return (
    <PageCard
      title={t('campaigns')}
      extra={
        <Space wrap>
          <Input.Search
            allowClear
            maxLength={200}
            placeholder={t('searchCampaigns')}
            aria-label={t('searchCampaigns')}
            onSearch={(v) => setQ(v.trim() || undefined)}
            style={{ width: 240 }}
            data-testid="campaign-search"
          />
          <Button icon={<ReloadOutlined />} onClick={() => void list.reload()} loading={list.loading}>
            {t('refresh')}
          </Button>
          <Button type="primary" icon={<PlusOutlined />} onClick={() => setCreating(true)} data-testid="new-campaign">
            {t('newCampaign')}
          </Button>
        </Space>
      }
    >
      {list.error && <Typography.Text type="danger">{list.error.message}</Typography.Text>}
      <Table<Coupon>
        rowKey="id"
        scroll={{ x: 960 }}
        size="middle"
        dataSource={list.items}
        loading={list.loading && !list.items}
        pagination={false}
        locale={{ emptyText: t(q ? 'noCampaignsFound' : 'noCampaigns') }}
        columns={[
          { title: t('id'), dataIndex: 'id', width: 60 },
          {
            // Wrapped, never cut: names that differ only at their end ("满100减50", "满10") must read apart,
            // and the window's end date is what an operator looks for.
            title: t('name'),
            dataIndex: 'name',
            render: (name: string, c) => (
              <Space orientation="vertical" size={0} style={{ overflowWrap: 'anywhere' }}>
                <Link to={`/campaigns/${c.id}`} data-testid={`campaign-${c.id}`}>
                  {name}
                </Link>
                <Typography.Text type="secondary" style={{ fontSize: 12 }}>
                  {t('grabWindow')}: <span style={{ whiteSpace: 'nowrap' }}>{shortTime(c.grabStartAt)} →</span>{' '}
                  <span style={{ whiteSpace: 'nowrap' }}>{shortTime(c.grabEndAt)}</span>
                </Typography.Text>
              </Space>
            ),
          },
          { title: t('status'), key: 'status', width: 90, render: (_, c) => <StatusTags coupon={c} t={t} /> },
          { title: t('stock'), key: 'stock', width: 200, render: (_, c) => <StockBar coupon={c} t={t} /> },
          { title: t('issued'), key: 'issued', align: 'right', width: 70, render: (_, c) => count(c.counts.issued) },
          { title: t('used'), key: 'used', align: 'right', width: 70, render: (_, c) => count(c.counts.used) },
          { title: t('locked'), key: 'locked', align: 'right', width: 70, render: (_, c) => count(lockedCount(c.counts)) },
          {
            title: t('actions'),
            key: 'actions',
            width: 215,
            // In view however far a narrow window scrolls the table.
            fixed: actionsPin,
            render: (_, c) => (
              <Space size={4}>
                <NavButton to={`/campaigns/${c.id}`} size="small" icon={<LineChartOutlined />}>
                  {t('live')}
                </NavButton>
                <PauseButton coupon={c} onDone={() => void list.reload()} />
                <Button size="small" onClick={() => setStockOf(c)}>
                  {t('adjustStock')}
                </Button>
              </Space>
            ),
          },
        ]}
      />
      <LoadMore list={list} />
      <CreateCampaign
        open={creating}
        onClose={() => setCreating(false)}
        onCreated={() => {
          setCreating(false);
          void list.reload();
        }}
      />
      {/* The row as last refreshed, for the remaining stock the dialog shows. */}
      <StockModal
        coupon={stockOf && (list.items?.find((c) => c.id === stockOf.id) ?? stockOf)}
        onClose={() => setStockOf(null)}
        onDone={() => void list.reload()}
        onStale={() => void list.reload()}
      />
    </PageCard>
  );
}
