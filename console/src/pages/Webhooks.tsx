import { useEffect, useState } from 'react';
import {
  Alert,
  App,
  Button,
  Checkbox,
  Drawer,
  Form,
  Input,
  Modal,
  Popconfirm,
  Segmented,
  Space,
  Switch,
  Table,
  Tag,
  Typography,
} from 'antd';
import { DeleteOutlined, PlusOutlined, RedoOutlined, SendOutlined } from '@ant-design/icons';
import { client, ok, type CreatedWebhook, type Delivery, type Webhook } from '../api';
import { said, showApiErrors } from '../apiForm';
import { count, time } from '../format';
import { label, useI18n } from '../i18n';
import { useActionsPin, usePagedList, usePoll } from '../hooks';
import { LoadMore } from '../LoadMore';
import { PageCard } from '../PageCard';

type EventType = Webhook['events'][number];
const EVENT_TYPES: EventType[] = [
  'user_coupon.issued',
  'user_coupon.locked',
  'user_coupon.released',
  'user_coupon.used',
  'user_coupon.expired',
  'user_coupon.voided',
];
const DELIVERY_COLOR = { PENDING: 'gold', DELIVERED: 'green', FAILED: 'red' } as const;
const DELIVERY_FILTERS = ['ALL', 'PENDING', 'DELIVERED', 'FAILED'] as const;

function CreateWebhook({ open, onClose, onCreated }: { open: boolean; onClose(): void; onCreated(w: CreatedWebhook): void }) {
  const { t } = useI18n();
  const [form] = Form.useForm<{ url: string; events?: EventType[]; description?: string }>();
  const [busy, setBusy] = useState(false);
  const [refusal, setRefusal] = useState<string | null>(null);
  // The form's store outlives the dialog: a URL refused and cancelled came back, with its refusal, the
  // next time the dialog opened.
  useEffect(() => {
    if (open) {
      form.resetFields();
      setRefusal(null);
    }
  }, [open, form]);
  return (
    <Modal
      title={t('newWebhook')}
      open={open}
      onCancel={onClose}
      onOk={() => form.submit()}
      okText={t('create')}
      okButtonProps={{ loading: busy, 'data-testid': 'webhook-submit' }}
      destroyOnHidden
      width={560}
    >
      {refusal && <Alert type="error" showIcon title={refusal} style={{ marginBottom: 16 }} />}
      <Form
        form={form}
        layout="vertical"
        onFinish={async (v) => {
          setBusy(true);
          setRefusal(null);
          try {
            const created = await ok(
              client.POST('/admin/webhooks', {
                body: {
                  url: v.url,
                  ...(v.events && v.events.length > 0 ? { events: v.events } : {}),
                  ...(v.description ? { description: v.description } : {}),
                },
              }),
            );
            form.resetFields();
            onCreated(created);
          } catch (err) {
            const rest = showApiErrors(form, err, [['url'], ['events'], ['description']]);
            if (rest) setRefusal(rest);
          } finally {
            setBusy(false);
          }
        }}
      >
        <Form.Item name="url" label="URL" rules={[{ required: true, message: t('required') }]}>
          <Input placeholder="https://hooks.example.com/coupons" data-testid="webhook-url" />
        </Form.Item>
        <Form.Item name="events" label={t('events')} extra={t('eventsHelp')}>
          <Checkbox.Group
            options={EVENT_TYPES.map((e) => ({ label: e, value: e }))}
            style={{ display: 'grid', gridTemplateColumns: '1fr 1fr' }}
          />
        </Form.Item>
        <Form.Item name="description" label={t('description')}>
          <Input />
        </Form.Item>
      </Form>
    </Modal>
  );
}

function Deliveries({ webhook, onClose }: { webhook: Webhook | null; onClose(): void }) {
  const { t } = useI18n();
  const { message } = App.useApp();
  // A filter chosen for one webhook's deliveries, not carried to the next webhook's.
  const [filter, setFilter] = useState<{ of?: string; status: (typeof DELIVERY_FILTERS)[number] }>({ status: 'ALL' });
  const status = filter.of === webhook?.id ? filter.status : 'ALL';
  const setStatus = (s: (typeof DELIVERY_FILTERS)[number]) => setFilter({ of: webhook?.id, status: s });
  const list = usePagedList(
    async (cursor) =>
      webhook
        ? ok(
            client.GET('/admin/webhooks/{webhookId}/deliveries', {
              params: { path: { webhookId: webhook.id }, query: { status: status === 'ALL' ? undefined : status, limit: 100, cursor } },
            }),
          )
        : { items: [], nextCursor: null },
    [webhook?.id, status],
    2000,
  );
  /** The named deliveries, or every failed one, sent again (one more attempt each). */
  const redeliver = async (deliveryIds?: string[]) => {
    if (!webhook) return;
    try {
      const { redelivered } = await ok(
        client.POST('/admin/webhooks/{webhookId}/redeliver', {
          params: { path: { webhookId: webhook.id } },
          body: deliveryIds ? { deliveryIds } : {},
        }),
      );
      // None failed for good: those being retried are on their way already, and "0 sent again" read as done.
      if (redelivered === 0) void message.info(t('nothingToRedeliver'));
      else void message.success(t('redelivered', { n: count(redelivered) }));
    } catch (err) {
      void message.error((err as Error).message);
    }
    void list.reload();
  };
  return (
    <Drawer title={webhook ? t('deliveriesOf', { url: webhook.url }) : ''} size={900} open={webhook !== null} onClose={onClose}>
      <Space wrap style={{ marginBottom: 16 }}>
        <Segmented
          value={status}
          onChange={setStatus}
          options={DELIVERY_FILTERS.map((f) => ({ value: f, label: f === 'ALL' ? t('all') : label(t, f) }))}
        />
        <Popconfirm title={t('redeliverFailedConfirm')} onConfirm={() => redeliver()} okText={t('redeliver')}>
          <Button icon={<RedoOutlined />} data-testid="redeliver-failed">
            {t('redeliverFailed')}
          </Button>
        </Popconfirm>
      </Space>
      {list.error && <Alert type="error" title={list.error.message} />}
      <Table<Delivery>
        rowKey="id"
        scroll={{ x: 1150 }}
        size="small"
        data-testid="deliveries"
        loading={list.loading && !list.items}
        dataSource={list.items}
        pagination={false}
        locale={{ emptyText: t('noDeliveries') }}
        expandable={{
          expandedRowRender: (d) => (
            <Table
              rowKey="attemptedAt"
              size="small"
              pagination={false}
              dataSource={d.attempts}
              columns={[
                { title: t('attemptedAt'), dataIndex: 'attemptedAt', render: time },
                { title: 'HTTP', dataIndex: 'statusCode', render: (c: number | null) => c ?? '—' },
                { title: t('error'), dataIndex: 'error', render: (e: string | null) => e ?? '—' },
                { title: t('durationMs'), dataIndex: 'durationMs', align: 'right' },
              ]}
            />
          ),
        }}
        columns={[
          { title: t('event'), dataIndex: 'eventId', width: 100 },
          { title: t('type'), dataIndex: 'type', render: (ty: string) => <Tag>{ty}</Tag> },
          { title: t('key_userCouponId'), dataIndex: 'userCouponId', width: 90 },
          {
            title: t('status'),
            dataIndex: 'status',
            width: 110,
            // Pending after a failed attempt: being retried (it shows its last answer), not waiting for its first try.
            render: (s: Delivery['status'], d) => (
              <Tag color={DELIVERY_COLOR[s]}>{s === 'PENDING' && d.attemptCount > 0 ? t('retrying') : label(t, s)}</Tag>
            ),
          },
          { title: t('attempts'), dataIndex: 'attemptCount', width: 90, align: 'right' },
          {
            title: t('lastAnswer'),
            key: 'last',
            width: 130,
            render: (_, d) => (d.lastStatusCode !== null ? `HTTP ${d.lastStatusCode}` : (d.lastError ?? '—')),
          },
          { title: t('nextAttemptAt'), dataIndex: 'nextAttemptAt', width: 170, render: time },
          { title: t('deliveredAt'), dataIndex: 'deliveredAt', width: 170, render: time },
          {
            key: 'redeliver',
            width: 110,
            // A pending delivery is on its way already.
            render: (_, d) =>
              d.status !== 'PENDING' && (
                <Button size="small" icon={<RedoOutlined />} onClick={() => redeliver([d.id])} data-testid={`redeliver-${d.id}`}>
                  {t('redeliver')}
                </Button>
              ),
          },
        ]}
      />
      <LoadMore list={list} />
    </Drawer>
  );
}

export function Webhooks() {
  const { t } = useI18n();
  const { message } = App.useApp();
  const [creating, setCreating] = useState(false);
  const [secret, setSecret] = useState<string | null>(null);
  const [deliveriesOf, setDeliveriesOf] = useState<Webhook | null>(null);
  const actionsPin = useActionsPin();
  const list = usePoll(() => ok(client.GET('/admin/webhooks')), [], 5000);
  const act = async (what: () => Promise<unknown>, done: string) => {
    try {
      await what();
      void message.success(done);
    } catch (err) {
      void message.error((err as Error).message);
    }
    void list.reload();
  };
  return (
    <PageCard
      title={t('webhooks')}
      extra={
        <Button type="primary" icon={<PlusOutlined />} onClick={() => setCreating(true)} data-testid="new-webhook">
          {t('newWebhook')}
        </Button>
      }
    >
      {list.error && <Alert type="error" title={list.error.message} style={{ marginBottom: 16 }} />}
      <Table<Webhook>
        rowKey="id"
        // Room for an address to be read whole: the fixed columns took all but 150 px of 900, and
        // URLs broke every few characters.
        scroll={{ x: 1200 }}
        size="middle"
        loading={list.loading && !list.data}
        dataSource={list.data}
        pagination={false}
        locale={{ emptyText: t('noWebhooks') }}
        columns={[
          { title: t('id'), dataIndex: 'id', width: 60 },
          {
            title: 'URL',
            dataIndex: 'url',
            width: 320,
            render: (url: string, w) => (
              <Space orientation="vertical" size={0}>
                <Typography.Text copyable>{url}</Typography.Text>
                {w.description && <Typography.Text type="secondary">{w.description}</Typography.Text>}
              </Space>
            ),
          },
          {
            title: t('events'),
            dataIndex: 'events',
            render: (events: string[]) =>
              events.length === EVENT_TYPES.length ? (
                <Tag color="blue">{t('allEvents')}</Tag>
              ) : (
                <Space size={[0, 4]} wrap>
                  {events.map((e) => (
                    <Tag key={e}>{e}</Tag>
                  ))}
                </Space>
              ),
          },
          {
            title: t('enabled'),
            key: 'enabled',
            width: 150,
            render: (_, w) => (
              <Space orientation="vertical" size={0}>
                <Switch
                  aria-label={`${t('enabled')}: ${w.url}`}
                  checked={w.enabled}
                  onChange={(enabled) =>
                    void act(
                      () => ok(client.PATCH('/admin/webhooks/{webhookId}', { params: { path: { webhookId: w.id } }, body: { enabled } })),
                      t(enabled ? 'webhookEnabled' : 'webhookDisabled'),
                    )
                  }
                />
                {w.disabledReason && (
                  <Typography.Text type="danger" style={{ fontSize: 12 }}>
                    {said(w.disabledReason)} ({time(w.disabledAt)})
                  </Typography.Text>
                )}
              </Space>
            ),
          },
          { title: t('failedInRow'), dataIndex: 'failedInRow', width: 110, align: 'right' },
          { title: t('createdAt'), dataIndex: 'createdAt', width: 170, render: time },
          {
            title: t('actions'),
            key: 'actions',
            width: 210,
            fixed: actionsPin,
            render: (_, w) => (
              <Space size={4}>
                <Button size="small" icon={<SendOutlined />} onClick={() => setDeliveriesOf(w)} data-testid={`deliveries-${w.id}`}>
                  {t('deliveries')}
                </Button>
                <Popconfirm
                  title={t('confirmDelete', { url: w.url })}
                  onConfirm={() =>
                    act(
                      () => ok(client.DELETE('/admin/webhooks/{webhookId}', { params: { path: { webhookId: w.id } } })),
                      t('webhookDeleted'),
                    )
                  }
                >
                  <Button size="small" danger icon={<DeleteOutlined />}>
                    {t('delete')}
                  </Button>
                </Popconfirm>
              </Space>
            ),
          },
        ]}
      />
      <CreateWebhook
        open={creating}
        onClose={() => setCreating(false)}
        onCreated={(w) => {
          setCreating(false);
          setSecret(w.secret);
          void list.reload();
        }}
      />
      <Modal
        open={secret !== null}
        title={t('secretTitle')}
        onOk={() => setSecret(null)}
        onCancel={() => setSecret(null)}
        cancelButtonProps={{ style: { display: 'none' } }}
      >
        <Alert type="warning" showIcon title={t('secretOnce')} style={{ marginBottom: 16 }} />
        <Typography.Paragraph copyable code data-testid="webhook-secret">
          {secret}
        </Typography.Paragraph>
      </Modal>
      <Deliveries webhook={deliveriesOf} onClose={() => setDeliveriesOf(null)} />
    </PageCard>
  );
}
