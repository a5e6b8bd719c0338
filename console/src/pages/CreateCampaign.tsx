import { useState } from 'react';
import { Alert, App, Button, Col, DatePicker, Drawer, Form, Input, InputNumber, Radio, Row, Space, Switch } from 'antd';
import dayjs, { type Dayjs } from 'dayjs';
import type { components } from '../../../client/schema';
import { ApiError, client, ok, type CouponView } from '../api';
import { showApiErrors } from '../apiForm';
import { useDrawerFocusReturn, useLazyIdempotencyKey } from '../hooks';
import { fold, yuan } from '../format';
import { useI18n } from '../i18n';
import { OutcomeAlert, useOutcome } from '../outcome';

interface Values {
  name: string;
  totalStock: number;
  perUserLimit: number;
  grabStartAt: Dayjs;
  grabEndAt: Dayjs;
  validity: { type: 'RELATIVE' | 'FIXED'; days?: number; startAt?: Dayjs; endAt?: Dayjs };
  discount: {
    type: 'AMOUNT' | 'PERCENT';
    thresholdCents: number;
    amountCents?: number;
    percentOff?: number;
    maxDiscountCents?: number | null;
  };
  rateLimitPerSecond?: number | null;
  returnOnRefund: boolean;
  stackable: boolean;
}

/** Every body path the form shows; the API's messages for these go under the field. */
const FIELDS = [
  ['name'],
  ['totalStock'],
  ['perUserLimit'],
  ['grabStartAt'],
  ['grabEndAt'],
  ['validity', 'type'],
  ['validity', 'days'],
  ['validity', 'startAt'],
  ['validity', 'endAt'],
  ['discount', 'type'],
  ['discount', 'thresholdCents'],
  ['discount', 'amountCents'],
  ['discount', 'percentOff'],
  ['discount', 'maxDiscountCents'],
  ['rateLimitPerSecond'],
  ['returnOnRefund'],
  ['stackable'],
];

/** The form shows yuan; the API takes cents. */
const cents = (amount: number) => Math.round(amount * 100);

/**
 * The API's messages on money speak of cents ("amountCents must not be less than 1") under a field
 * the operator filled in yuan: said again in yuan ("must not be less than ¥0.01"; showApiErrors
 * leaves the field's name to its label).
 */
function inYuan(err: unknown): unknown {
  if (!(err instanceof ApiError) || !err.details?.fields) return err;
  const fields = Object.fromEntries(
    Object.entries(err.details.fields).map(([path, messages]) => [
      path,
      path.endsWith('Cents') ? messages.map((m) => m.replace(/than (\d+)\b/g, (_, n: string) => `than ¥${yuan(Number(n))}`)) : messages,
    ]),
  );
  return new ApiError(err.status, err.code, err.message, { ...err.details, fields });
}

/** Only the fields of the chosen type: the API refuses the other type's fields. */
function discountBody(d: Values['discount']): components['schemas']['DiscountDto'] {
  const thresholdCents = cents(d.thresholdCents);
  if (d.type === 'AMOUNT') return { type: 'AMOUNT', thresholdCents, amountCents: cents(d.amountCents as number) };
  return {
    type: 'PERCENT',
    thresholdCents,
    percentOff: d.percentOff as number,
    ...(d.maxDiscountCents == null ? {} : { maxDiscountCents: cents(d.maxDiscountCents) }),
  };
}

/** Every field the form requires is there (its rules checked them); the API judges the values. */
function toBody(v: Values): components['schemas']['CreateCouponDto'] {
  return {
    name: v.name,
    totalStock: v.totalStock,
    perUserLimit: v.perUserLimit,
    grabStartAt: v.grabStartAt.toISOString(),
    grabEndAt: v.grabEndAt.toISOString(),
    validity:
      v.validity.type === 'RELATIVE'
        ? { type: 'RELATIVE', days: v.validity.days as number }
        : { type: 'FIXED', startAt: (v.validity.startAt as Dayjs).toISOString(), endAt: (v.validity.endAt as Dayjs).toISOString() },
    discount: discountBody(v.discount),
    ...(v.rateLimitPerSecond == null ? {} : { rateLimitPerSecond: v.rateLimitPerSecond }),
    returnOnRefund: v.returnOnRefund,
    stackable: v.stackable,
  };
}

/**
 * Only "required" is checked here: ranges and cross-field rules are the API's, and its messages
 * are shown as they come, so the form can never drift from what the service accepts.
 */
export function CreateCampaign({ open, onClose, onCreated }: { open: boolean; onClose(): void; onCreated(c: CouponView): void }) {
  const { t } = useI18n();
  const { message } = App.useApp();
  useDrawerFocusReturn(open);
  const [form] = Form.useForm<Values>();
  const key = useLazyIdempotencyKey();
  const [busy, setBusy] = useState(false);
  const [refusal, setRefusal] = useState<string | null>(null);
  const outcome = useOutcome();
  const validityType = Form.useWatch(['validity', 'type'], form);
  const discountType = Form.useWatch(['discount', 'type'], form);
  const percentOff = Form.useWatch(['discount', 'percentOff'], form);
  // What the shopper pays, said as the shop says it (20% off is 打 8 折): a 折 typed as the percentage would be the reverse.
  const paysHelp =
    typeof percentOff === 'number' && Number.isInteger(percentOff) && percentOff >= 1 && percentOff <= 100
      ? t('percentOffHelp', { pays: 100 - percentOff, fold: fold(percentOff) })
      : undefined;
  const required = [{ required: true, message: t('required') }];
  // Judged as typed: an InputNumber with `precision` rounded 2.5 to 3 and sent that.
  const whole = { type: 'integer' as const, message: t('wholeNumber') };
  const requiredWhole = [...required, whole];
  // Yuan to the fen, judged as typed too: `precision={2}` rounded ¥10.005 to ¥10.01 and sent 1001 cents.
  const fen = {
    validator: async (_: unknown, v: unknown) => {
      // Compared with itself to the fen, not by v * 100 against a tolerance, which large amounts' float error exceeds.
      if (typeof v === 'number' && Number(v.toFixed(2)) !== v) throw new Error(t('wholeFen'));
    },
  };

  const submit = async (values: Values) => {
    setBusy(true);
    setRefusal(null);
    outcome.reset();
    try {
      // Create pressed again after a lost answer creates one campaign.
      const created = await ok(client.POST('/admin/coupons', { body: toBody(values), headers: { 'idempotency-key': key.take() } }));
      void message.success(t('created', { name: created.name }));
      form.resetFields();
      key.renew();
      onCreated(created);
    } catch (err) {
      // Maybe made: the key is kept, so Create pressed again makes it once.
      if (outcome.failed(err)) return;
      const rest = showApiErrors(form, inYuan(err), FIELDS);
      if (rest) setRefusal(t('apiRefused', { message: rest }));
    } finally {
      setBusy(false);
    }
  };

  const now = dayjs().startOf('minute');
  return (
    <Drawer
      title={t('newCampaign')}
      size={560}
      open={open}
      onClose={onClose}
      destroyOnHidden
      footer={
        <Space style={{ float: 'right' }}>
          <Button onClick={onClose}>{t('cancel')}</Button>
          <Button type="primary" loading={busy} onClick={() => form.submit()} data-testid="create-submit">
            {t('create')}
          </Button>
        </Space>
      }
    >
      <OutcomeAlert unsure={outcome.unsure} />
      {refusal && <Alert type="error" showIcon title={refusal} style={{ marginBottom: 16 }} />}
      <Form<Values>
        form={form}
        layout="vertical"
        onFinish={submit}
        onValuesChange={key.renew}
        initialValues={{
          totalStock: 1000,
          perUserLimit: 1,
          grabStartAt: now,
          grabEndAt: now.add(1, 'day'),
          validity: { type: 'RELATIVE', days: 7 },
          discount: { type: 'AMOUNT', thresholdCents: 100, amountCents: 10, percentOff: 10 },
          returnOnRefund: false,
          stackable: false,
        }}
      >
        <Form.Item name="name" label={t('name')} rules={required}>
          <Input placeholder={t('namePlaceholder')} data-testid="field-name" />
        </Form.Item>
        <Row gutter={16}>
          <Col span={12}>
            <Form.Item name="totalStock" label={t('totalStock')} rules={requiredWhole}>
              <InputNumber style={{ width: '100%' }} data-testid="field-totalStock" />
            </Form.Item>
          </Col>
          <Col span={12}>
            <Form.Item name="perUserLimit" label={t('perUserLimit')} rules={requiredWhole}>
              <InputNumber style={{ width: '100%' }} />
            </Form.Item>
          </Col>
        </Row>
        {/* A date and time to the second takes a phone's whole width: in half of it the seconds were cut. */}
        <Row gutter={16}>
          <Col xs={24} sm={12}>
            <Form.Item name="grabStartAt" label={t('grabStartAt')} rules={required}>
              <DatePicker showTime style={{ width: '100%' }} />
            </Form.Item>
          </Col>
          <Col xs={24} sm={12}>
            <Form.Item name="grabEndAt" label={t('grabEndAt')} rules={required}>
              <DatePicker showTime style={{ width: '100%' }} />
            </Form.Item>
          </Col>
        </Row>
        <Form.Item name={['validity', 'type']} label={t('validity')}>
          <Radio.Group
            optionType="button"
            options={[
              { label: t('validityRelative'), value: 'RELATIVE' },
              { label: t('validityFixed'), value: 'FIXED' },
            ]}
          />
        </Form.Item>
        {validityType === 'FIXED' ? (
          <Row gutter={16}>
            <Col xs={24} sm={12}>
              <Form.Item name={['validity', 'startAt']} label={t('validityStartAt')} rules={required}>
                <DatePicker showTime style={{ width: '100%' }} />
              </Form.Item>
            </Col>
            <Col xs={24} sm={12}>
              <Form.Item name={['validity', 'endAt']} label={t('validityEndAt')} rules={required}>
                <DatePicker showTime style={{ width: '100%' }} />
              </Form.Item>
            </Col>
          </Row>
        ) : (
          <Form.Item name={['validity', 'days']} label={t('validityDays')} rules={requiredWhole}>
            <InputNumber style={{ width: '100%' }} data-testid="field-validity-days" />
          </Form.Item>
        )}
        <Form.Item name={['discount', 'type']} label={t('discountType')}>
          <Radio.Group
            optionType="button"
            data-testid="field-discount-type"
            options={[
              { label: t('discountTypeAmount'), value: 'AMOUNT' },
              { label: t('discountTypePercent'), value: 'PERCENT' },
            ]}
          />
        </Form.Item>
        <Row gutter={16}>
          <Col span={discountType === 'PERCENT' ? 8 : 12}>
            <Form.Item name={['discount', 'thresholdCents']} label={t('threshold')} rules={[...required, fen]}>
              <InputNumber style={{ width: '100%' }} prefix="¥" />
            </Form.Item>
          </Col>
          {discountType === 'PERCENT' ? (
            <>
              <Col span={8}>
                <Form.Item name={['discount', 'percentOff']} label={t('percentOff')} rules={requiredWhole} extra={paysHelp}>
                  <InputNumber style={{ width: '100%' }} suffix="%" data-testid="field-percentOff" />
                </Form.Item>
              </Col>
              <Col span={8}>
                <Form.Item name={['discount', 'maxDiscountCents']} label={t('maxDiscount')} extra={t('maxDiscountHelp')} rules={[fen]}>
                  <InputNumber style={{ width: '100%' }} prefix="¥" data-testid="field-maxDiscount" />
                </Form.Item>
              </Col>
            </>
          ) : (
            <Col span={12}>
              <Form.Item name={['discount', 'amountCents']} label={t('discountAmount')} rules={[...required, fen]}>
                <InputNumber style={{ width: '100%' }} prefix="¥" />
              </Form.Item>
            </Col>
          )}
        </Row>
        <Form.Item name="rateLimitPerSecond" label={t('rateLimit')} extra={t('rateLimitHelp')} rules={[whole]}>
          <InputNumber style={{ width: '100%' }} />
        </Form.Item>
        <Row gutter={16}>
          <Col span={12}>
            <Form.Item name="returnOnRefund" label={t('returnOnRefund')} valuePropName="checked">
              <Switch />
            </Form.Item>
          </Col>
          <Col span={12}>
            <Form.Item name="stackable" label={t('stackable')} valuePropName="checked">
              <Switch data-testid="field-stackable" />
            </Form.Item>
          </Col>
        </Row>
      </Form>
    </Drawer>
  );
}
