import { useEffect, useState, type ReactNode } from 'react';
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
  // The form's store outlives the dialog, and its values win over initialValues when the form mounts
  // again: what was typed and cancelled (for another campaign, even) came back. Set here, before or
  // after that mount, they are the values the dialog is opened with.
  useEffect(() => {
    // eslint-disable-next-line @typescript-eslint/no-explicit-any -- antd types the values by the form's own field names
    if (props.open) form.setFieldsValue(props.initialValues as any);
    // Only on opening: the initial values are a new object on every render.
  }, [props.open, form]);
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
