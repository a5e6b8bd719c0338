import { Button, Space, Typography } from 'antd';
import { count } from './format';
import type { PagedList } from './hooks';
import { useI18n } from './i18n';

/** Under a paged list: says that rows are missing, and reads the next page. */
export function LoadMore({ list }: { list: PagedList<unknown> }) {
  const { t } = useI18n();
  if (!list.more) return null;
  return (
    <Space style={{ width: '100%', justifyContent: 'center', marginTop: 16 }}>
      <Typography.Text type="secondary">{t('moreRows', { n: count(list.items?.length ?? 0) })}</Typography.Text>
      <Button onClick={list.loadMore} loading={list.loading} data-testid="load-more">
        {t('loadMore')}
      </Button>
    </Space>
  );
}
