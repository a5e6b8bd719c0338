import { Component, type ReactNode } from 'react';
import { Button, Result, Space } from 'antd';
import type { Translate } from './i18n';

/**
 * A page that throws while rendering would otherwise leave a white window (React unmounts the whole
 * tree): this shows the error and a way back instead, the menu and header staying usable. Keyed by
 * the path where it is used, so going to another page starts it afresh.
 */
export class ErrorBoundary extends Component<{ t: Translate; onBack(): void; children: ReactNode }, { error: Error | null }> {
  state = { error: null as Error | null };

  static getDerivedStateFromError(error: Error) {
    return { error };
  }

  render() {
    const { error } = this.state;
    if (!error) return this.props.children;
    const { t, onBack } = this.props;
    return (
      <Result
        status="error"
        title={t('pageFailed')}
        subTitle={<span data-testid="page-error">{error.message}</span>}
        extra={
          <Space>
            <Button
              type="primary"
              onClick={() => {
                // Cleared here too: from the campaigns page itself the key stays the same.
                this.setState({ error: null });
                onBack();
              }}
              data-testid="page-error-back"
            >
              {t('backToCampaigns')}
            </Button>
            <Button onClick={() => window.location.reload()}>{t('reloadPage')}</Button>
          </Space>
        }
      />
    );
  }
}
