import { Segmented } from 'antd';
import { useSearchParams } from 'react-router-dom';
import { client, ok } from '../api';
import { usePagedList } from '../hooks';
import { useI18n } from '../i18n';
import { CompensationTable } from './CompensationTable';
import { PageCard } from '../PageCard';

const FILTERS = ['PENDING', 'DONE', 'REJECTED', 'ALL'] as const;

const COMPENSATIONS_POLL_MS = 5000;

export function Compensations() {
  const { t } = useI18n();
  const [params, setParams] = useSearchParams();
  const status = (params.get('status') ?? 'PENDING') as (typeof FILTERS)[number];
  const list = usePagedList(
    (cursor) =>
      ok(client.GET('/admin/compensations', { params: { query: { status: status === 'ALL' ? undefined : status, limit: 100, cursor } } })),
    [status],
    // Another operator (another tab) may decide them meanwhile.
    COMPENSATIONS_POLL_MS,
  );
  return (
    <PageCard
      title={t('compensations')}
      extra={
        <Segmented
          value={status}
          onChange={(v) => setParams({ status: v })}
          options={FILTERS.map((f) => ({ value: f, label: f === 'ALL' ? t('all') : t(f) }))}
        />
      }
    >
      <CompensationTable list={list} />
    </PageCard>
  );
}
