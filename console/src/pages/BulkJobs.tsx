import { CampaignRef } from '../CampaignRef';
import { useMemo, useState, type ReactElement } from 'react';
import {
  Alert,
  App,
  Button,
  Descriptions,
  Drawer,
  Form,
  Input,
  Modal,
  Popconfirm,
  Progress,
  Segmented,
  Select,
  Space,
  Switch,
  Table,
  Tag,
  Typography,
  Upload,
} from 'antd';
import { DownloadOutlined, PlusOutlined, StopOutlined, UploadOutlined } from '@ant-design/icons';
import { Link, useSearchParams } from 'react-router-dom';
import { client, fetchWithUploadProgress, ok, type IssuanceJob, type SkippedLine } from '../api';
import { renamedField, showApiErrors } from '../apiForm';
import { count, time } from '../format';
import { useDrawerFocusReturn, useIdempotencyKey, usePagedList, usePoll } from '../hooks';
import { LoadMore } from '../LoadMore';
import { label, useI18n, type Translate } from '../i18n';
import { OutcomeAlert, useOutcome } from '../outcome';
import { PageCard } from '../PageCard';

const STATUS_COLOR = { QUEUED: 'default', RUNNING: 'processing', COMPLETED: 'green', FAILED: 'red', CANCELLED: 'orange' } as const;
const SKIP_REASONS = ['USER_LIMIT_REACHED', 'SOLD_OUT', 'INVALID_USER_ID', 'DUPLICATE', 'COUPON_EXPIRED'] as const;
/**
 * The most a CSV upload may be (the server's CSV_MAX_BYTES). A larger file is refused when chosen:
 * sent, it was refused with 413 only once the server had counted 64 MiB of it, which over a slow
 * link is minutes of progress bar for nothing.
 */
const CSV_MAX_BYTES = 64 * 1024 * 1024;

const unfinished = (j: IssuanceJob) => j.status === 'QUEUED' || j.status === 'RUNNING';
/** Polled every second while a job runs; a finished list changes only when someone adds a job. */
const refreshEvery = (jobs: IssuanceJob[]) => (jobs.some(unfinished) ? 1000 : 10_000);

export function JobStatus({ job, t }: { job: IssuanceJob; t: Translate }) {
  return <Tag color={STATUS_COLOR[job.status]}>{label(t, job.status)}</Tag>;
}

/** Lines decided (issued or skipped) of the list; invalid ids are skipped as the list is stored, before the job starts. */
export function JobProgress({ job }: { job: IssuanceJob }) {
  const done = job.issued + job.skipped;
  const percent = job.total === 0 ? 100 : Math.floor((done / job.total) * 1000) / 10;
  return (
    <div data-testid={`job-progress-${job.id}`} data-done={done} data-total={job.total}>
      <Progress
        percent={percent}
        size="small"
        status={
          job.status === 'FAILED' ? 'exception' : job.status === 'RUNNING' ? 'active' : job.status === 'CANCELLED' ? 'normal' : undefined
        }
        format={() => `${count(done)} / ${count(job.total)}`}
      />
    </div>
  );
}

/**
 * The ids a pasted list holds, as the server counts them: one per line (LF, CRLF or CR), blank lines
 * none. The text goes up as it is, a CSV body, for the server to judge each line (split on spaces,
 * "bad id!" would become a user "bad" who gets a coupon) and number it: so a skipped line's number is
 * its line in the text pasted, blank lines counted (sent as a JSON list without them, the numbers
 * after a blank line were one short).
 */
const pastedCount = (text: string) => text.split(/\r\n|\r|\n/).filter((line) => line.trim().length > 0).length;

/** Campaigns to pick one by name, newest first, 100 more per "load more" at the foot of the picker; read again when `deps` change. */
function useCouponOptions(deps: unknown[]) {
  const list = usePagedList((cursor) => ok(client.GET('/admin/coupons', { params: { query: { limit: 100, cursor } } })), deps);
  const options = useMemo(() => list.items?.map((c) => ({ value: c.id, label: `#${c.id} ${c.name}` })), [list.items]);
  const popupRender = (menu: ReactElement) => (
    <>
      {menu}
      {/* The picker keeps the focus (and its search text) while Load more is pressed, so it stays open. */}
      <div onMouseDown={(e) => e.preventDefault()}>
        <LoadMore list={list} />
      </div>
    </>
  );
  return { options, loading: list.loading, popupRender };
}

/** How much of the list went up; at 100 % the server is still storing it, and answers once it has. */
type CsvCharset = 'utf-8' | 'gb18030';

/**
 * UTF-8 when the file's first MiB is UTF-8 (an ASCII file is both), else GB18030, the superset of the
 * GBK that Chinese Excel saves "CSV" in: sent as UTF-8, such a file was refused as not UTF-8 text.
 */
async function csvCharset(file: Blob): Promise<CsvCharset> {
  try {
    // stream: a character cut at the end of the slice is not an error.
    new TextDecoder('utf-8', { fatal: true }).decode(await file.slice(0, 1024 * 1024).arrayBuffer(), { stream: true });
    return 'utf-8';
  } catch {
    return 'gb18030';
  }
}

function UploadProgress({ fraction }: { fraction: number }) {
  const { t } = useI18n();
  const percent = Math.floor(fraction * 100);
  return (
    <div data-testid="upload-progress" data-percent={percent} style={{ marginBottom: 16 }}>
      <Progress percent={percent} status="active" />
      <Typography.Text type="secondary">{t(percent < 100 ? 'uploading' : 'uploadStoring')}</Typography.Text>
    </div>
  );
}

interface CreateValues {
  couponId: string;
  source: 'paste' | 'csv';
  userIds?: string;
  reason: string;
  fromStock: boolean;
}

function CreateJob({
  open,
  couponId,
  onClose,
  onCreated,
}: {
  open: boolean;
  couponId?: string;
  onClose(): void;
  onCreated(jobId: string): void;
}) {
  const { t } = useI18n();
  const { message } = App.useApp();
  const [form] = Form.useForm<CreateValues>();
  const [file, setFile] = useState<File | null>(null);
  // The chosen file's text encoding, read off its first bytes: a CSV saved by Chinese Excel is GBK.
  const [charset, setCharset] = useState<CsvCharset>('utf-8');
  const [fileError, setFileError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  // The part of a CSV body sent so far (0 to 1) while one goes up, else null.
  const [uploaded, setUploaded] = useState<number | null>(null);
  const [refusal, setRefusal] = useState<string | null>(null);
  const outcome = useOutcome();
  // One key per job being made: a retry after a lost answer gets the same job, not a second one.
  const [key, renewKey] = useIdempotencyKey();
  const coupons = useCouponOptions([open]);
  const source = Form.useWatch('source', form);
  const pasted = Form.useWatch('userIds', form);

  const submit = async (v: CreateValues) => {
    if (v.source === 'csv' && !file) {
      setFileError(t('fileRequired'));
      return;
    }
    setBusy(true);
    setRefusal(null);
    outcome.reset();
    try {
      const created = await ok(
        client.POST('/admin/coupons/{couponId}/issuances', {
          params: {
            path: { couponId: v.couponId },
            header: { 'Idempotency-Key': key },
            query: { reason: v.reason, fromStock: v.fromStock ? 'true' : 'false' },
          },
          // A file of up to 64 MiB takes a while: sent with a fetch that reports how much went up.
          fetch: v.source === 'csv' ? fetchWithUploadProgress(setUploaded) : undefined,
          // Either goes up as it is, the file streamed by the browser; the server reads it line by line.
          body: (v.source === 'csv' ? file : (v.userIds ?? '')) as unknown as string,
          bodySerializer: (b: unknown) => b as BodyInit,
          // A pasted list is read as a file is: a first line user_id or userId (a spreadsheet column's header) is no id.
          headers: { 'content-type': v.source === 'csv' ? `text/csv; charset=${charset}` : 'text/csv; charset=utf-8' },
        }),
      );
      void message.success(t('jobCreated', { id: created.jobId }));
      renewKey();
      setFile(null);
      form.resetFields();
      onCreated(created.jobId);
    } catch (err) {
      // Maybe made: the key is kept, so Create pressed again makes one job.
      if (outcome.failed(err)) return;
      // A list with no id in it: under the pasted list, not above the form.
      const placed = v.source === 'paste' ? renamedField(err, 'body', 'userIds') : err;
      const rest = showApiErrors(form, placed, [['userIds'], ['reason'], ['fromStock']]);
      if (rest) setRefusal(rest);
    } finally {
      setBusy(false);
      setUploaded(null);
    }
  };

  return (
    <Modal
      title={t('newBulkJob')}
      open={open}
      onCancel={onClose}
      onOk={() => form.submit()}
      okText={t('create')}
      okButtonProps={{ loading: busy, 'data-testid': 'job-submit' }}
      destroyOnHidden
      width={600}
    >
      <OutcomeAlert unsure={outcome.unsure} />
      {refusal && <Alert type="error" showIcon title={refusal} style={{ marginBottom: 16 }} />}
      {uploaded !== null && <UploadProgress fraction={uploaded} />}
      <Form<CreateValues>
        form={form}
        layout="vertical"
        onFinish={submit}
        onValuesChange={renewKey}
        initialValues={{ couponId, source: 'paste', fromStock: true }}
      >
        <Form.Item name="couponId" label={t('couponId')} rules={[{ required: true, message: t('required') }]}>
          <Select
            showSearch={{ optionFilterProp: 'label' }}
            options={coupons.options}
            loading={coupons.loading}
            popupRender={coupons.popupRender}
            data-testid="job-coupon"
          />
        </Form.Item>
        <Form.Item name="source">
          <Segmented<CreateValues['source']>
            options={[
              { value: 'paste', label: t('pasteIds') },
              { value: 'csv', label: t('uploadCsv') },
            ]}
          />
        </Form.Item>
        {source === 'csv' ? (
          <Form.Item
            label={t('csvFile')}
            extra={
              file ? `${t('csvHelp')} · ${t('fileCharset', { charset: charset === 'utf-8' ? 'UTF-8' : 'GBK (GB18030)' })}` : t('csvHelp')
            }
            required
            validateStatus={fileError ? 'error' : undefined}
            help={fileError ?? undefined}
          >
            <Upload
              accept=".csv,.txt,text/csv,text/plain"
              maxCount={1}
              beforeUpload={(f) => {
                const tooLarge = f.size > CSV_MAX_BYTES;
                setFile(tooLarge ? null : f);
                if (!tooLarge) void csvCharset(f).then(setCharset);
                renewKey();
                setFileError(tooLarge ? t('fileTooLarge') : null);
                // Kept here and sent with the job, not uploaded on its own.
                return false;
              }}
              onRemove={() => {
                setFile(null);
                renewKey();
              }}
              fileList={file ? [{ uid: 'csv', name: file.name, size: file.size, status: 'done' }] : []}
            >
              <Button icon={<UploadOutlined />} data-testid="job-file">
                {t('chooseFile')}
              </Button>
            </Upload>
          </Form.Item>
        ) : (
          <Form.Item
            name="userIds"
            label={t('userIds')}
            extra={`${t('pasteHelp')} · ${t('idCount', { n: count(pastedCount(pasted ?? '')) })}`}
            rules={[{ required: true, whitespace: true, message: t('idsRequired') }]}
          >
            <Input.TextArea rows={6} placeholder={t('userIdsPlaceholder')} data-testid="job-user-ids" />
          </Form.Item>
        )}
        <Form.Item name="reason" label={t('reason')} rules={[{ required: true, whitespace: true, message: t('reasonRequired') }]}>
          <Input placeholder={t('jobReasonPlaceholder')} data-testid="job-reason" />
        </Form.Item>
        <Form.Item name="fromStock" label={t('fromStock')} valuePropName="checked" extra={t('fromStockHelp')}>
          <Switch />
        </Form.Item>
      </Form>
    </Modal>
  );
}

function CancelJob({ job, onDone }: { job: IssuanceJob; onDone(): void }) {
  const { t } = useI18n();
  const { message } = App.useApp();
  if (!unfinished(job)) return null;
  return (
    <Popconfirm
      title={t('confirmCancelJob', { id: job.id })}
      // Not "OK" and "Cancel": after a button named Cancel, an operator pressing "Cancel" again to confirm kept the job running.
      okText={t('stopJob')}
      cancelText={t('keepRunning')}
      okButtonProps={{ danger: true, 'data-testid': 'cancel-job-confirm' }}
      onConfirm={async () => {
        try {
          await ok(client.POST('/admin/issuance-jobs/{jobId}/cancel', { params: { path: { jobId: job.id } } }));
          void message.success(t('jobCancelled', { id: job.id }));
        } catch (err) {
          void message.error((err as Error).message);
        }
        onDone();
      }}
    >
      <Button size="small" danger icon={<StopOutlined />} data-testid={`cancel-job-${job.id}`}>
        {t('cancelJob')}
      </Button>
    </Popconfirm>
  );
}

type SkipReason = SkippedLine['reason'];

/** Saves the job's skipped lines (of `reason`) as the server's CSV, under the file name it gives. */
const downloadSkipped = (jobId: string, reason: SkipReason | undefined) =>
  saveCsv(client.GET('/admin/issuance-jobs/{jobId}/skipped.csv', { params: { path: { jobId }, query: { reason } }, parseAs: 'blob' }));

/** Saves a CSV answer under the file name the server gives. */
async function saveCsv(call: Promise<{ data?: Blob; error?: unknown; response: Response }>): Promise<void> {
  const csv = await ok(call);
  const { response } = await call;
  const url = URL.createObjectURL(csv);
  const link = document.createElement('a');
  link.href = url;
  link.download = /filename="([^"]+)"/.exec(response.headers.get('content-disposition') ?? '')?.[1] ?? '';
  link.click();
  // Chrome reads the file after click() returns: revoked at once, the download would fail.
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

/** A CSV download's button state: busy while the file comes, a failure shown as a message. */
function useDownload(): [boolean, (save: () => Promise<void>) => Promise<void>] {
  const { message } = App.useApp();
  const [downloading, setDownloading] = useState(false);
  const download = async (save: () => Promise<void>) => {
    setDownloading(true);
    try {
      await save();
    } catch (err) {
      void message.error((err as Error).message);
    } finally {
      setDownloading(false);
    }
  };
  return [downloading, download];
}

/** A cancelled or failed job's lines it did not reach, as the CSV a new job takes to finish it. */
function DownloadUnprocessed({ job }: { job: IssuanceJob }) {
  const { t } = useI18n();
  const [downloading, download] = useDownload();
  if ((job.status !== 'CANCELLED' && job.status !== 'FAILED') || job.issued + job.skipped >= job.total) return null;
  const save = () =>
    saveCsv(client.GET('/admin/issuance-jobs/{jobId}/unprocessed.csv', { params: { path: { jobId: job.id } }, parseAs: 'blob' }));
  return (
    <Button
      size="small"
      icon={<DownloadOutlined />}
      loading={downloading}
      onClick={() => void download(save)}
      data-testid="download-unprocessed"
    >
      {t('downloadUnprocessed')}
    </Button>
  );
}

function SkippedLines({ job }: { job: IssuanceJob }) {
  const { t } = useI18n();
  const [reason, setReason] = useState<SkipReason>();
  const [downloading, download] = useDownload();
  // Reloaded when the count grows: the list only ever gets longer while the job runs.
  const lines = usePagedList(
    (cursor) =>
      ok(
        client.GET('/admin/issuance-jobs/{jobId}/skipped', { params: { path: { jobId: job.id }, query: { limit: 100, cursor, reason } } }),
      ),
    [job.id, job.skipped, reason],
  );
  return (
    <>
      <Space wrap style={{ marginBottom: 12 }}>
        <Select<SkipReason>
          allowClear
          placeholder={t('allReasons')}
          aria-label={t('filterByReason')}
          style={{ width: 260, maxWidth: '100%' }}
          value={reason}
          onChange={setReason}
          options={SKIP_REASONS.map((r) => ({ value: r, label: `${label(t, r)} (${count(job.skippedByReason[r])})` }))}
        />
        <Button
          icon={<DownloadOutlined />}
          loading={downloading}
          disabled={(reason ? job.skippedByReason[reason] : job.skipped) === 0}
          onClick={() => void download(() => downloadSkipped(job.id, reason))}
          data-testid="download-skipped"
        >
          {t('downloadCsv')}
        </Button>
      </Space>
      {lines.error && <Alert type="error" title={lines.error.message} />}
      <Table<SkippedLine>
        rowKey="line"
        size="small"
        data-testid="skipped-lines"
        loading={lines.loading && !lines.items}
        dataSource={lines.items}
        pagination={false}
        locale={{ emptyText: t('noSkipped') }}
        columns={[
          { title: t('line'), dataIndex: 'line', width: 80, align: 'right' },
          { title: t('userId'), dataIndex: 'userId', render: (u: string) => <Typography.Text code>{u}</Typography.Text> },
          { title: t('reason'), dataIndex: 'reason', render: (r: SkipReason) => <Tag>{label(t, r)}</Tag> },
        ]}
      />
      <LoadMore list={lines} />
    </>
  );
}

function JobDetail({ jobId, onClose, onChanged }: { jobId: string | null; onClose(): void; onChanged(): void }) {
  const { t } = useI18n();
  const [every, setEvery] = useState(1000);
  const job = usePoll(
    async () => {
      if (!jobId) return null;
      const j = await ok(client.GET('/admin/issuance-jobs/{jobId}', { params: { path: { jobId } } }));
      setEvery(unfinished(j) ? 1000 : 0);
      return j;
    },
    [jobId],
    every || undefined,
  );
  const j = job.data;
  useDrawerFocusReturn(jobId !== null);
  return (
    <Drawer title={jobId ? t('job', { id: jobId }) : ''} size={760} open={jobId !== null} onClose={onClose} destroyOnHidden>
      {job.error && <Alert type="error" title={job.error.message} style={{ marginBottom: 16 }} />}
      {j && (
        <Space
          orientation="vertical"
          size="large"
          style={{ width: '100%' }}
          data-testid="job-detail"
          data-status={j.status}
          data-job-id={j.id}
        >
          <Space>
            <JobStatus job={j} t={t} />
            <CancelJob
              job={j}
              onDone={() => {
                void job.reload();
                onChanged();
              }}
            />
            <DownloadUnprocessed job={j} />
          </Space>
          <JobProgress job={j} />
          <Descriptions size="small" column={{ xs: 1, sm: 2 }} bordered>
            <Descriptions.Item label={t('couponId')}>
              <CampaignRef id={j.couponId} />
            </Descriptions.Item>
            <Descriptions.Item label={t('reason')}>{j.reason}</Descriptions.Item>
            <Descriptions.Item label={t('total')}>{count(j.total)}</Descriptions.Item>
            <Descriptions.Item label={t('fromStock')}>{t(j.fromStock ? 'yes' : 'no')}</Descriptions.Item>
            <Descriptions.Item label={t('issued')}>
              <span data-testid="job-issued">{count(j.issued)}</span>
            </Descriptions.Item>
            <Descriptions.Item label={t('skipped')}>{count(j.skipped)}</Descriptions.Item>
            <Descriptions.Item label={t('createdAt')}>{time(j.createdAt)}</Descriptions.Item>
            <Descriptions.Item label={t('startedAt')}>{time(j.startedAt)}</Descriptions.Item>
            <Descriptions.Item label={t('finishedAt')} span="filled">
              {time(j.finishedAt)}
            </Descriptions.Item>
          </Descriptions>
          <div>
            <Typography.Title level={5}>{t('skippedByReason')}</Typography.Title>
            <Space size={[8, 8]} wrap data-testid="skipped-by-reason">
              {SKIP_REASONS.map((r) => (
                <Tag key={r} color={j.skippedByReason[r] > 0 ? 'volcano' : undefined}>
                  {label(t, r)}: {count(j.skippedByReason[r])}
                </Tag>
              ))}
            </Space>
          </div>
          <div>
            <Typography.Title level={5}>{t('skippedLines')}</Typography.Title>
            <SkippedLines job={j} />
          </div>
        </Space>
      )}
    </Drawer>
  );
}

export function BulkJobs() {
  const { t } = useI18n();
  const [params, setParams] = useSearchParams();
  const couponId = params.get('couponId') ?? undefined;
  const [creating, setCreating] = useState(params.get('new') !== null);
  const [detailOf, setDetailOf] = useState<string | null>(null);
  const coupons = useCouponOptions([]);
  const list = usePagedList(
    (cursor) => ok(client.GET('/admin/issuance-jobs', { params: { query: { couponId, limit: 20, cursor } } })),
    [couponId],
    refreshEvery,
  );
  // A campaign's "bulk issue" link opens the form (`new`); closed, the address no longer asks for it.
  const closeCreate = () => {
    setCreating(false);
    setParams(couponId ? { couponId } : {});
  };
  const couponName = (id: string) => coupons.options?.find((c) => c.value === id)?.label ?? `#${id}`;

  return (
    <PageCard
      title={t('bulkJobs')}
      extra={
        <Space wrap>
          <Select
            allowClear
            showSearch={{ optionFilterProp: 'label' }}
            placeholder={t('allCampaigns')}
            aria-label={t('campaigns')}
            style={{ width: 260, maxWidth: '100%' }}
            value={couponId}
            options={coupons.options}
            loading={coupons.loading}
            popupRender={coupons.popupRender}
            onChange={(id?: string) => setParams(id ? { couponId: id } : {})}
          />
          <Button type="primary" icon={<PlusOutlined />} onClick={() => setCreating(true)} data-testid="new-job">
            {t('newBulkJob')}
          </Button>
        </Space>
      }
    >
      {list.error && <Alert type="error" title={list.error.message} style={{ marginBottom: 16 }} />}
      <Table<IssuanceJob>
        rowKey="id"
        scroll={{ x: 1080 }}
        size="middle"
        data-testid="jobs"
        loading={list.loading && !list.items}
        dataSource={list.items}
        pagination={false}
        locale={{ emptyText: t('noJobs') }}
        onRow={(j) => ({ onClick: () => setDetailOf(j.id), style: { cursor: 'pointer' } })}
        columns={[
          {
            title: t('id'),
            dataIndex: 'id',
            width: 60,
            // A button, not an <a> without href: the row's click is the mouse's way in, this is the keyboard's.
            render: (id: string) => (
              <Button
                type="link"
                size="small"
                style={{ padding: 0 }}
                data-testid={`job-${id}`}
                onClick={(e) => {
                  e.stopPropagation();
                  setDetailOf(id);
                }}
              >
                {id}
              </Button>
            ),
          },
          {
            title: t('couponId'),
            dataIndex: 'couponId',
            render: (id: string, j) => (
              <Space orientation="vertical" size={0}>
                <Link to={`/campaigns/${id}`} onClick={(e) => e.stopPropagation()}>
                  {couponName(id)}
                </Link>
                <Typography.Text type="secondary" style={{ fontSize: 12 }}>
                  {j.reason}
                </Typography.Text>
              </Space>
            ),
          },
          { title: t('status'), key: 'status', width: 110, render: (_, j) => <JobStatus job={j} t={t} /> },
          { title: t('progress'), key: 'progress', width: 220, render: (_, j) => <JobProgress job={j} /> },
          { title: t('issued'), dataIndex: 'issued', align: 'right', width: 80, render: count },
          { title: t('skipped'), dataIndex: 'skipped', align: 'right', width: 80, render: count },
          { title: t('fromStockShort'), dataIndex: 'fromStock', width: 100, align: 'center', render: (f: boolean) => t(f ? 'yes' : 'no') },
          { title: t('createdAt'), dataIndex: 'createdAt', width: 170, render: time },
          {
            title: t('actions'),
            key: 'actions',
            width: 110,
            render: (_, j) => (
              <span onClick={(e) => e.stopPropagation()}>
                <CancelJob job={j} onDone={() => void list.reload()} />
              </span>
            ),
          },
        ]}
      />
      <LoadMore list={list} />
      <CreateJob
        open={creating}
        couponId={couponId}
        onClose={closeCreate}
        onCreated={(jobId) => {
          closeCreate();
          setDetailOf(jobId);
          void list.reload();
        }}
      />
      <JobDetail jobId={detailOf} onClose={() => setDetailOf(null)} onChanged={() => void list.reload()} />
    </PageCard>
  );
}
