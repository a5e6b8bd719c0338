import { App, Form, Input, Typography } from 'antd';
import { client, ok, type CouponView } from '../api';
import { FormModal } from '../FormModal';
import { count } from '../format';
import { useI18n } from '../i18n';

/** The range PATCH /admin/coupons/:id takes: 1..1,000,000 admissions per second. */
const isRate = (v: string) => /^[1-9][0-9]{0,6}$/.test(v) && Number(v) <= 1_000_000;

/** A campaign's grab rate limit, changed during a sale: `PATCH /admin/coupons/:id`; empty goes back to the service default (null). */
export function RateLimitModal({ coupon, onClose, onDone }: { coupon: CouponView | null; onClose(): void; onDone(c: CouponView): void }) {
  const { t } = useI18n();
  const { message } = App.useApp();
  const [form] = Form.useForm<{ rate: string }>();
  return (
    <FormModal
      title={coupon ? `${t('rateLimit')}: ${coupon.name}` : ''}
      open={coupon !== null}
      form={form}
      initialValues={{ rate: coupon?.rateLimitPerSecond?.toString() ?? '' }}
      errorField="rate"
      submitTestId="rate-submit"
      onClose={onClose}
      onSubmit={async ({ rate }) => {
        if (!coupon) return;
        const typed = (rate ?? '').trim();
        const c = await ok(
          client.PATCH('/admin/coupons/{couponId}', {
            params: { path: { couponId: coupon.id } },
            body: { rateLimitPerSecond: typed === '' ? null : Number(typed) },
          }),
        );
        void message.success(
          c.rateLimitPerSecond === null
            ? t('rateLimitDefaulted', { name: c.name })
            : t('rateLimitSet', { name: c.name, rate: count(c.rateLimitPerSecond) }),
        );
        onDone(c);
      }}
    >
      <Typography.Paragraph type="secondary">{t('rateLimitNote')}</Typography.Paragraph>
      {/* A plain input judged as typed, as the stock dialog's: a number input would round or clamp what was typed. */}
      <Form.Item
        name="rate"
        label={t('rateLimitPerSecondLabel')}
        extra={t('rateLimitHelp')}
        rules={[
          {
            validator: async (_, v: string | undefined) => {
              if (v && v.trim() !== '' && !isRate(v.trim())) throw new Error(t('rateLimitRange'));
            },
          },
        ]}
      >
        <Input inputMode="numeric" autoComplete="off" />
      </Form.Item>
    </FormModal>
  );
}
