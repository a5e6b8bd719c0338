import { useState, type ReactNode } from 'react';
import { Alert, Button, Card, Form, Input, Space, Typography } from 'antd';
import { tokenProblem } from '../auth';
import { useI18n, type MessageKey } from '../i18n';

const PROBLEM_MESSAGE: Record<NonNullable<ReturnType<typeof tokenProblem>>, MessageKey> = {
  malformed: 'tokenMalformed',
  expired: 'tokenExpired',
  notAdmin: 'tokenNotAdmin',
};

export function SignIn({
  notice,
  languageSwitch,
  onSignIn,
}: {
  notice: MessageKey | null;
  languageSwitch: ReactNode;
  onSignIn(token: string): void;
}) {
  const { t } = useI18n();
  const [error, setError] = useState<MessageKey | null>(null);
  const shown = error ?? notice;
  return (
    <div style={{ minHeight: '100vh', display: 'flex', alignItems: 'center', justifyContent: 'center', background: '#f0f2f5' }}>
      <Card style={{ width: 520 }} title={t('appTitle')} extra={languageSwitch}>
        <Typography.Title level={4}>{t('signInTitle')}</Typography.Title>
        <Typography.Paragraph type="secondary">{t('signInHelp')}</Typography.Paragraph>
        {shown && <Alert data-testid="signin-notice" type="warning" showIcon title={t(shown)} style={{ marginBottom: 16 }} />}
        <Form
          layout="vertical"
          onFinish={({ token }: { token: string }) => {
            const value = token.trim();
            const problem = tokenProblem(value);
            if (problem) setError(PROBLEM_MESSAGE[problem]);
            else onSignIn(value);
          }}
        >
          <Form.Item name="token" label={t('token')} rules={[{ required: true, whitespace: true, message: t('tokenRequired') }]}>
            <Input.TextArea rows={4} spellCheck={false} placeholder="eyJhbGciOiJIUzI1NiIs…" style={{ fontFamily: 'monospace' }} />
          </Form.Item>
          <Space orientation="vertical" style={{ width: '100%' }}>
            <Button type="primary" htmlType="submit" block>
              {t('signIn')}
            </Button>
            <Typography.Text type="secondary" code copyable>
              {t('tokenHint')}
            </Typography.Text>
          </Space>
        </Form>
      </Card>
    </div>
  );
}
