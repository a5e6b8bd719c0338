import { App, Form, Input, Radio, Typography } from 'antd';
import { ApiError, client, ok, type CouponView } from '../api';
import { count } from '../format';
import { FormModal } from '../FormModal';
import { useI18n } from '../i18n';

/** 1 or more units, written as digits only (spaces around them aside). */
const isWholeUnits = (v: string) => /^[1-9][0-9]*$/.test(v) && Number.isSafeInteger(Number(v));

type StockForm = { direction: 1 | -1; amount: string };

/** Add or remove stock: `POST /admin/coupons/:id/stock` with a positive or negative delta. */
export function StockModal({
  coupon,
  onClose,
  onDone,
  onStale,
}: {
  coupon: CouponView | null;
  onClose(): void;
  onDone(c: CouponView): void;
  /** The server refused a removal of more than remains: the stock shown is older than the server's. */
  onStale(): void;
}) {
  const { t } = useI18n();
  const { message } = App.useApp();
  const [form] = Form.useForm<StockForm>();
  return (
    <FormModal<StockForm>
      title={coupon ? `${t('adjustStock')}: ${coupon.name}` : ''}
      open={coupon !== null}
      form={form}
      initialValues={{ direction: 1, amount: '100' }}
      errorField="amount"
      fieldCodes={['INSUFFICIENT_STOCK']}
      submitTestId="stock-submit"
      onClose={onClose}
      confirm={({ direction, amount }) =>
        direction === -1 && coupon ? t('confirmRemoveStock', { amount: count(Number(amount)), name: coupon.name }) : null
      }
      onSubmit={async ({ direction, amount }, key) => {
        if (!coupon) return;
        const c = await ok(
          client.POST('/admin/coupons/{couponId}/stock', {
            params: { path: { couponId: coupon.id } },
            body: { delta: direction * Number(amount) },
            // OK pressed again after a lost answer changes the stock once.
            headers: { 'idempotency-key': key },
          }),
        ).catch((err: unknown) => {
          // Stock removed or grabbed since the dialog's figure was read: left as it was, the dialog
          // went on showing more than remains until the page's next refresh.
          if (err instanceof ApiError && err.code === 'INSUFFICIENT_STOCK') onStale();
          throw err;
        });
        void message.success(t('stockChanged', { name: c.name, remaining: count(c.remainingStock), total: count(c.initStock) }));
        onDone(c);
      }}
    >
      {coupon && (
        <Typography.Paragraph data-testid="stock-remaining">
          {t('stock')}: {t('remainingOf', { remaining: count(coupon.remainingStock), total: count(coupon.initStock) })}
        </Typography.Paragraph>
      )}
      <Form.Item name="direction">
        <Radio.Group
          optionType="button"
          buttonStyle="solid"
          options={[
            { label: t('addStock'), value: 1 },
            { label: t('removeStock'), value: -1 },
          ]}
        />
      </Form.Item>
      {/* A plain input judged as typed: a number input would round 2.5, raise 0 to its minimum or keep
          its last value for "abc", and send a change the operator did not ask for. */}
      <Form.Item
        name="amount"
        label={t('amount')}
        dependencies={['direction']}
        rules={[
          { required: true, message: t('required') },
          ({ getFieldValue }) => ({
            validator: async (_, v: string | undefined) => {
              if (v && !isWholeUnits(v.trim())) throw new Error(t('wholeUnits'));
              // Refused as typed, not after its confirmation; the server still decides on the stock as it is then.
              if (v && coupon && getFieldValue('direction') === -1 && Number(v.trim()) > coupon.remainingStock)
                throw new Error(t('moreThanRemain', { remaining: count(Math.max(coupon.remainingStock, 0)) }));
            },
          }),
        ]}
      >
        <Input inputMode="numeric" autoComplete="off" data-testid="stock-amount" />
      </Form.Item>
    </FormModal>
  );
}
