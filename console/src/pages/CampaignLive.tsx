import { useEffect, useMemo, useRef, useState } from 'react';
import { Badge, Button, Card, Col, Descriptions, Row, Segmented, Space, Statistic, Typography } from 'antd';
import { ArrowLeftOutlined, ReloadOutlined, UsergroupAddOutlined } from '@ant-design/icons';
import type { EChartsOption } from 'echarts';
import dayjs from 'dayjs';
import { useParams } from 'react-router-dom';
import { client, ok, type CouponView, type Series } from '../api';
import { Chart } from '../chart';
import { count, fold, time, yuan } from '../format';
import { usePoll } from '../hooks';
import { NavButton } from '../NavButton';
import { label, useI18n, type Translate } from '../i18n';
import { PageCard } from '../PageCard';
import { lockedCount, PauseButton, StatusTags, StockBar } from './Campaigns';
import { RateLimitModal } from './RateLimitModal';
import { StockModal } from './StockModal';

const POLL_MS = 1000;
/** The counts are a real count on the server: refreshed now and then, never every second. */
const COUNTS_MS = 10_000;
const WINDOWS = [60, 300];
const COLORS: Record<string, string> = {
  ISSUED: '#52c41a',
  REPLAYED: '#1677ff',
  SOLD_OUT: '#f5222d',
  USER_LIMIT_REACHED: '#fa8c16',
  RATE_LIMITED: '#722ed1',
  COUPON_PAUSED: '#8c8c8c',
  GRAB_NOT_STARTED: '#bfbfbf',
  GRAB_ENDED: '#595959',
};
const ORDER = Object.keys(COLORS);

function describeDiscount(c: CouponView, t: Translate): string {
  const d = c.discount;
  const threshold = yuan(d.thresholdCents);
  if (d.type === 'PERCENT') {
    const cap = d.maxDiscountCents === null ? '' : t('maxDiscountDesc', { max: yuan(d.maxDiscountCents) });
    const said = { percent: d.percentOff, threshold, fold: fold(d.percentOff) };
    return t(d.thresholdCents === 0 ? 'percentDescAny' : 'percentDesc', said) + cap;
  }
  return t(d.thresholdCents === 0 ? 'discountDescAny' : 'discountDesc', { amount: yuan(d.amountCents), threshold });
}

function chartOption(series: Series, stockTrail: [number, number][], t: Translate): EChartsOption {
  const from = Date.parse(series.from);
  const x = Array.from({ length: series.seconds }, (_, i) => from + i * 1000);
  const outcomes = Object.keys(series.outcomes).sort((a, b) => (ORDER.indexOf(a) + 1 || 99) - (ORDER.indexOf(b) + 1 || 99));
  const totals = outcomes.map((o) => `${label(t, o)} ${count(series.outcomes[o].reduce((a, b) => a + b, 0))}`).join(', ');
  return {
    animation: false,
    // What the chart shows, in words: ECharts puts it on the chart as its aria-label.
    aria: {
      enabled: true,
      label: { description: t('chartSummary', { minutes: series.seconds / 60, totals, remaining: count(series.remainingStock) }) },
    },
    tooltip: { trigger: 'axis' },
    // Named in order: series replaced on each update would otherwise be listed in the order they first appeared.
    // Below the chart: above it, on a phone, the legend wrapped onto the axes' names.
    legend: { bottom: 0, data: [...outcomes.map((o) => label(t, o)), t('remaining')] },
    grid: { left: 56, right: 64, top: 40, bottom: 56 },
    xAxis: {
      type: 'time',
      min: from,
      max: x[x.length - 1],
      axisLabel: { formatter: (v: number) => dayjs(v).format('HH:mm:ss'), hideOverlap: true },
    },
    yAxis: [
      { type: 'value', name: t('grabsAxis'), minInterval: 1 },
      { type: 'value', name: t('remaining'), min: 0, max: series.initStock || undefined, splitLine: { show: false } },
    ],
    series: [
      ...outcomes.map((o) => ({
        id: o,
        name: label(t, o),
        type: 'bar' as const,
        stack: 'grabs',
        barCategoryGap: '10%',
        itemStyle: { color: COLORS[o] ?? '#d9d9d9' },
        data: series.outcomes[o].map((n, i) => [x[i], n]),
      })),
      {
        id: 'remaining',
        name: t('remaining'),
        type: 'line' as const,
        yAxisIndex: 1,
        showSymbol: false,
        step: 'end' as const,
        lineStyle: { width: 2, color: '#d4380d' },
        itemStyle: { color: '#d4380d' },
        data: stockTrail.filter(([at]) => at >= from),
      },
    ],
  };
}

export function CampaignLive() {
  const { couponId = '' } = useParams();
  const { t } = useI18n();
  const [stockOpen, setStockOpen] = useState(false);
  const [rateOpen, setRateOpen] = useState(false);
  const [windowSeconds, setWindowSeconds] = useState(300);
  const path = { couponId };
  const detail = usePoll(() => ok(client.GET('/admin/coupons/{couponId}', { params: { path } })), [couponId], COUNTS_MS);
  const live = usePoll(
    () => ok(client.GET('/admin/coupons/{couponId}/series', { params: { path, query: { seconds: windowSeconds } } })),
    [couponId, windowSeconds],
    POLL_MS,
  );

  // Remaining stock as sampled by this page since it opened (the server keeps no stock history).
  const trail = useRef<[number, number][]>([]);
  const [, redraw] = useState(0);
  useEffect(() => {
    if (!live.data) return;
    trail.current = [
      ...trail.current.filter(([at]) => at > Date.now() - Math.max(...WINDOWS) * 1000),
      [Date.now(), live.data.remainingStock],
    ];
    redraw((n) => n + 1);
  }, [live.data]);

  const option = useMemo(() => (live.data ? chartOption(live.data, trail.current, t) : null), [live.data, t]);
  const recent = useMemo(() => {
    if (!live.data) return 0;
    return Object.values(live.data.outcomes).reduce((sum, points) => sum + points.slice(-5).reduce((a, b) => a + b, 0), 0);
  }, [live.data]);

  const coupon = detail.data;
  // The live numbers are newer than the detail's: show them on the detail too.
  const current =
    coupon && live.data
      ? { ...coupon, status: live.data.status, remainingStock: live.data.remainingStock, initStock: live.data.initStock }
      : coupon;

  return (
    <Space orientation="vertical" size="large" style={{ width: '100%' }}>
      <Space wrap>
        <NavButton to="/campaigns" icon={<ArrowLeftOutlined />}>
          {t('back')}
        </NavButton>
        <Typography.Title level={3} style={{ margin: 0 }} data-testid="live-title">
          {coupon ? `#${coupon.id} ${coupon.name}` : `#${couponId}`}
        </Typography.Title>
        {current && <StatusTags coupon={current} t={t} />}
        {current && <PauseButton coupon={current} onDone={() => void detail.reload()} />}
        {current && (
          <Button size="small" onClick={() => setStockOpen(true)}>
            {t('adjustStock')}
          </Button>
        )}
        {current && (
          <Button size="small" onClick={() => setRateOpen(true)}>
            {t('rateLimitButton')}
          </Button>
        )}
        {/* Not for a campaign that does not exist: its job would only be refused. */}
        {current && (
          <NavButton to={`/bulk?couponId=${couponId}&new`} size="small" icon={<UsergroupAddOutlined />}>
            {t('bulkIssue')}
          </NavButton>
        )}
      </Space>
      {detail.error && <Typography.Text type="danger">{detail.error.message}</Typography.Text>}
      {/* Two by two on a phone, four in a row from md up. */}
      <Row gutter={[16, 16]}>
        <Col xs={24} sm={12} md={6}>
          <Card style={{ height: '100%' }}>
            <Statistic title={t('remaining')} value={live.data?.remainingStock ?? '—'} data-testid="live-remaining" />
          </Card>
        </Col>
        <Col xs={24} sm={12} md={6}>
          <Card style={{ height: '100%' }}>
            <Statistic title={t('initStock')} value={live.data?.initStock ?? '—'} />
          </Card>
        </Col>
        <Col xs={24} sm={12} md={6}>
          <Card style={{ height: '100%' }}>
            <Statistic title={t('lastSecond')} value={recent} data-testid="live-recent" />
          </Card>
        </Col>
        <Col xs={24} sm={12} md={6}>
          <Card style={{ height: '100%' }}>
            <Typography.Text type="secondary">{t('stock')}</Typography.Text>
            {live.data && <StockBar coupon={live.data} t={t} />}
            <div style={{ marginTop: 8 }}>
              {live.error ? (
                <Badge status="error" text={t('stalled', { message: live.error.message })} />
              ) : (
                <Badge status="processing" text={t('refreshing')} />
              )}
            </div>
          </Card>
        </Col>
      </Row>
      <PageCard
        title={t('grabsPerSecond', { minutes: windowSeconds / 60 })}
        extra={
          <Segmented<number>
            data-testid="live-window"
            value={windowSeconds}
            onChange={setWindowSeconds}
            options={WINDOWS.map((s) => ({ value: s, label: t('minutes', { n: s / 60 }) }))}
          />
        }
      >
        {option && <Chart option={option} height={340} testId="live-chart" />}
      </PageCard>
      {coupon && (
        <PageCard
          title={t('countsTitle')}
          extra={
            <Space wrap>
              <Typography.Text type="secondary">{t('countsNote')}</Typography.Text>
              <Button size="small" icon={<ReloadOutlined />} onClick={() => void detail.reload()} data-testid="counts-refresh" />
            </Space>
          }
        >
          <Row gutter={[16, 16]} style={{ marginBottom: 24 }}>
            {(['issued', 'unused', 'locked', 'used', 'expired', 'void'] as const).map((k) => (
              <Col xs={8} md={4} key={k}>
                <Statistic title={t(k)} value={k === 'locked' ? lockedCount(coupon.counts) : coupon.counts[k]} data-testid={`count-${k}`} />
              </Col>
            ))}
          </Row>
          <Descriptions size="small" column={{ xs: 1, md: 2 }} bordered>
            <Descriptions.Item label={t('discountRule')}>{describeDiscount(coupon, t)}</Descriptions.Item>
            <Descriptions.Item label={t('perUserLimit')}>{t('perUserDesc', { n: count(coupon.perUserLimit) })}</Descriptions.Item>
            <Descriptions.Item label={t('grabWindow')}>
              {time(coupon.grabStartAt)} → {time(coupon.grabEndAt)}
            </Descriptions.Item>
            <Descriptions.Item label={t('validity')}>
              {coupon.validity.type === 'RELATIVE'
                ? t('validityRelativeDesc', { days: coupon.validity.days })
                : t('validityFixedDesc', { start: time(coupon.validity.startAt), end: time(coupon.validity.endAt) })}
            </Descriptions.Item>
            <Descriptions.Item label={t('rateLimit')}>
              {coupon.rateLimitPerSecond === null ? t('rateLimitDefault') : count(coupon.rateLimitPerSecond)}
            </Descriptions.Item>
            <Descriptions.Item label={t('returnOnRefund')}>{t(coupon.returnOnRefund ? 'yes' : 'no')}</Descriptions.Item>
            <Descriptions.Item label={t('stackable')}>{t(coupon.stackable ? 'yes' : 'no')}</Descriptions.Item>
          </Descriptions>
        </PageCard>
      )}
      {/* The live numbers (updated every second), not the detail's of up to COUNTS_MS ago. */}
      <StockModal
        coupon={stockOpen && current ? current : null}
        onClose={() => setStockOpen(false)}
        onDone={() => void detail.reload()}
        onStale={() => void live.reload()}
      />
      <RateLimitModal coupon={rateOpen && coupon ? coupon : null} onClose={() => setRateOpen(false)} onDone={() => void detail.reload()} />
    </Space>
  );
}
