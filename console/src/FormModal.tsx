import { useState, type ReactNode } from 'react';
import { Form, Modal, type FormInstance } from 'antd';
import { showApiErrors } from './apiForm';

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
  onSubmit(values: V): Promise<void>;
  children: ReactNode;
}) {
  const { form, onClose } = props;
  // antd types field names per form; the one named here is a key of V, which its name type does not see.
  const untyped: FormInstance = form;
  const [busy, setBusy] = useState(false);
  return (
    <Modal
      title={props.title}
      open={props.open}
      onCancel={onClose}
      onOk={() => form.submit()}
      okButtonProps={{ loading: busy, 'data-testid': props.submitTestId }}
      destroyOnHidden
    >
      <Form
        form={form}
        layout="vertical"
        initialValues={props.initialValues}
        onFinish={async (values) => {
          setBusy(true);
          try {
            await props.onSubmit(values);
            onClose();
          } catch (err) {
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
