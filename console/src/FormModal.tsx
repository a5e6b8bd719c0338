import { useEffect, useState, type ReactNode } from 'react';
import { Alert, App, Form, Modal, type FormInstance } from 'antd';
import { ApiError } from './api';
import { showApiErrors } from './apiForm';
import { useLazyIdempotencyKey } from './hooks';
import { useI18n } from './i18n';

/**
 * A dialog of one small form whose submit is one API call: busy while it runs, closed when it
 * succeeds, and the API's refusal shown under `errorField` (or under the fields it names).
 */
export function FormModal<V extends object>(props: {
  title: string;
  open: boolean;
  form: FormInstance<V>;
  initialValues: V;
  errorField: keyof V & string;
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
  const { t } = useI18n();
  const { modal } = App.useApp();
  // No answer at all (the server unreachable, the connection lost): not the value's fault, and the change may have been made.
  const [noAnswer, setNoAnswer] = useState(false);
  // The form's store outlives the dialog, and its values win over initialValues when the form mounts
  // again: what was typed and cancelled (for another campaign, even) came back. Set here, before or
  // after that mount, they are the values the dialog is opened with.
  useEffect(() => {
    if (props.open) {
      untyped.setFieldsValue(props.initialValues);
      key.renew();
      setNoAnswer(false);
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
      {noAnswer && <Alert type="warning" showIcon title={t('noAnswer')} style={{ marginBottom: 16 }} data-testid="no-answer" />}
      <Form
        form={form}
        layout="vertical"
        initialValues={props.initialValues}
        onValuesChange={key.renew}
        onFinish={async (values) => {
          const question = props.confirm?.(values);
          if (question && !(await modal.confirm({ title: question, okButtonProps: { danger: true, 'data-testid': 'confirm-ok' } }))) return;
          setBusy(true);
          setNoAnswer(false);
          try {
            await props.onSubmit(values, key.take());
            onClose();
          } catch (err) {
            if (!(err instanceof ApiError)) return setNoAnswer(true);
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
