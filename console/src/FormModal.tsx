import { useEffect, useState, type ReactNode } from 'react';
import { Alert, App, Form, Modal, type FormInstance } from 'antd';
import { ApiError } from './api';
import { OutcomeAlert, useOutcome } from './outcome';
import { showApiErrors } from './apiForm';
import { useLazyIdempotencyKey } from './hooks';

/**
 * A dialog of one small form whose submit is one API call: busy while it runs, closed when it
 * succeeds. A refusal of the value (validation, or a code in `fieldCodes`) is shown under
 * `errorField`; any other above the form.
 */
export function FormModal<V extends object>(props: {
  title: string;
  open: boolean;
  form: FormInstance<V>;
  initialValues: V;
  errorField: keyof V & string;
  /** The API's codes that refuse the value typed (as INSUFFICIENT_STOCK does the amount), shown under errorField. */
  fieldCodes?: string[];
  submitTestId: string;
  onClose(): void;
  /** `key`: one Idempotency-Key per filled-in form, so a submit repeated after a lost answer is applied once. */
  onSubmit(values: V, key: string): Promise<void>;
  /** The question to ask before these values are sent (cancelled, nothing is), or null when they need none. */
  confirm?(values: V): string | null;
  children: ReactNode;
}) {
  const { form, onClose } = props;
  // antd types field names per form; the one named here is a key of V, which its name type does not see.
  const untyped: FormInstance = form;
  const [busy, setBusy] = useState(false);
  const key = useLazyIdempotencyKey();
  const { modal } = App.useApp();
  const outcome = useOutcome();
  // A refusal that is no fault of the value (a lock wait's 503, a campaign gone): under the field it read as a wrong value.
  const [refusal, setRefusal] = useState<string | null>(null);
  // The form's store outlives the dialog, and its values win over initialValues when the form mounts
  // again: what was typed and cancelled (for another campaign, even) came back. Set here, before or
  // after that mount, they are the values the dialog is opened with.
  useEffect(() => {
    if (props.open) {
      untyped.setFieldsValue(props.initialValues);
      key.renew();
      outcome.reset();
      setRefusal(null);
    }
    // Only on opening: the initial values are a new object on every render.
  }, [props.open, form, key]);
  return (
    <Modal
      title={props.title}
      open={props.open}
      onCancel={onClose}
      onOk={() => form.submit()}
      okButtonProps={{ loading: busy, 'data-testid': props.submitTestId }}
      destroyOnHidden
    >
      <OutcomeAlert unsure={outcome.unsure} />
      {refusal && <Alert type="error" showIcon title={refusal} style={{ marginBottom: 16 }} data-testid="form-refusal" />}
      <Form
        form={form}
        layout="vertical"
        initialValues={props.initialValues}
        onValuesChange={key.renew}
        onFinish={async (values) => {
          const question = props.confirm?.(values);
          if (question && !(await modal.confirm({ title: question, okButtonProps: { danger: true, 'data-testid': 'confirm-ok' } }))) return;
          setBusy(true);
          outcome.reset();
          setRefusal(null);
          try {
            await props.onSubmit(values, key.take());
            onClose();
          } catch (err) {
            if (outcome.failed(err) || !(err instanceof ApiError)) return;
            if (!err.details?.fields && !props.fieldCodes?.includes(err.code)) return setRefusal(`${err.code}: ${err.message}`);
            const rest = showApiErrors(form, err, []);
            if (rest) untyped.setFields([{ name: props.errorField, errors: [rest] }]);
          } finally {
            setBusy(false);
          }
        }}
      >
        {props.children}
      </Form>
    </Modal>
  );
}
