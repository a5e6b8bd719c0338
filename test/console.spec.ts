import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { brotliDecompressSync, gunzipSync } from 'node:zlib';
import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import type { Browser, Locator, Page } from 'playwright-core';
import request from 'supertest';
import * as undici from 'undici';
import { IssuanceRunner } from '../src/issuance/issuance-runner.js';
import { CSV_MAX_BYTES } from '../src/issuance/user-id-lines.js';
import { launchChromium } from './support/browser.js';
import { createCoupon, grabUserCoupon } from './support/factories.js';
import { adminToken, bearer, serviceToken, startTestApp, tokenFor, type TestApp } from './support/harness.js';
import { WebhookReceiver } from './support/webhook-receiver.js';

/**
 * The console in a real browser (Debian's Chromium) against the real server and database: every
 * step is what an operator does, and each page is saved as a screenshot under test-results/console/.
 */
const SHOTS = 'test-results/console';

let t: TestApp;
let browser: Browser;
let page: Page;
let couponId: string;
let percentCouponId: string;
let receiver: WebhookReceiver;
const pageErrors: string[] = [];

/** Reads until `ok` holds or `ms` pass, and returns the last value read, for the assertion to judge. */
async function eventually<T>(read: () => Promise<T>, ok: (v: T) => boolean, ms = 5000): Promise<T> {
  const until = Date.now() + ms;
  for (;;) {
    const v = await read();
    if (ok(v) || Date.now() > until) return v;
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Ant Design's opening animations (drawers, modals) take 0.3 s; a click before they end can be lost on a loaded machine. */
const settle = () => page.waitForTimeout(400);

const remainingStock = async () =>
  (await request(t.url).get(`/admin/coupons/${couponId}`).set(bearer(adminToken()))).body.remainingStock as number;

/** The campaigns list's stock dialog for `couponId`, with `amount` typed. */
async function openStockDialog(amount: string): Promise<void> {
  const row = page.locator('.ant-table-row', { has: page.getByTestId(`campaign-${couponId}`) });
  await row.getByRole('button', { name: 'Stock', exact: true }).click();
  await page.getByTestId('stock-amount').fill(amount);
  await settle();
}

/** "Remove stock" in the open stock dialog: a click the opening modal did not take yet would leave "Add stock" chosen, so clicked until it is taken. */
async function chooseRemoveStock(): Promise<void> {
  const removing = page.locator('.ant-radio-button-wrapper-checked', { hasText: 'Remove stock' });
  for (let i = 0; i < 5 && !(await removing.isVisible()); i++) {
    await page.getByText('Remove stock', { exact: true }).click();
    await removing.waitFor({ timeout: 2000 }).catch(() => undefined);
  }
  await removing.waitFor();
}

/** A new webhook whose URL carries credentials, refused with `message` under the field; the dialog then closed by Escape. */
async function refuseWebhookUrl(message: string): Promise<void> {
  await page.getByTestId('new-webhook').click();
  await page.getByTestId('webhook-url').fill('http://user:pass@127.0.0.1:9/hook');
  await settle();
  await page.getByTestId('webhook-submit').click();
  await page.getByText(message, { exact: true }).waitFor();
  await page.keyboard.press('Escape');
  await page.locator('.ant-modal').first().waitFor({ state: 'hidden' });
}

/** The browser's log of an answer the test made it lose or refuse (`logged`, e.g. 'net::ERR_FAILED') was the test's doing. */
function forgetLogged(logged: string): void {
  const others = pageErrors.splice(0).filter((e) => !e.includes(logged));
  pageErrors.push(...others);
}

/**
 * The next request to `url` makes its change on the server, but the page never learns it: no answer
 * at all (`lost`, logged as net::ERR_FAILED), or a 503 OUTCOME_UNKNOWN (logged as status of 503).
 */
async function loseAnswer(url: string, how: 'lost' | 'unknown'): Promise<void> {
  await page.route(
    url,
    async (route) => {
      await route.fetch();
      if (how === 'lost') return route.abort();
      await route.fulfill({
        status: 503,
        contentType: 'application/json',
        body: JSON.stringify({ code: 'OUTCOME_UNKNOWN', message: 'The outcome of the write is unknown', details: {} }),
      });
    },
    { times: 1 },
  );
}

/** The dialog (`within`, its selector) says its change may or may not have been made: no message under a field, no refusal. */
async function expectMaybeMade(within: string): Promise<void> {
  await page.getByTestId('no-answer').waitFor();
  expect(await page.getByTestId('no-answer').textContent()).toMatch(/may or may not have been made/);
  expect(await page.locator(`${within} .ant-form-item-explain-error`).count()).toBe(0);
  expect(await page.locator(`${within} .ant-alert-error`).count()).toBe(0);
}

/** Presses OK again after an answer the dialog could not trust; the browser's log of that answer (`logged`) was the test's doing. */
async function resubmitStock(expected: number, logged: string): Promise<void> {
  await page.getByTestId('stock-submit').click();
  await page.locator('.ant-modal').waitFor({ state: 'hidden' });
  expect(await remainingStock()).toBe(expected);
  forgetLogged(logged);
}

/**
 * Until the toasts are gone. A toast stays while the pointer is over it, and one that appears under
 * the pointer (over a drawer's close button, after a click next to it) takes every click there and
 * never leaves: so the pointer moves away first.
 */
async function noToasts(): Promise<void> {
  await page.mouse.move(0, 0);
  for (let i = 0; i < 100 && (await page.locator('.ant-message-notice').count()) > 0; i++) await page.waitForTimeout(100);
}

/** The new bulk job dialog, switched to uploading a CSV file. */
async function openCsvJobDialog(): Promise<void> {
  await page.getByTestId('new-job').click();
  await page.locator('.ant-modal').waitFor();
  await settle();
  // Under a loaded CI machine a click landing while the modal still opens was once lost (the file
  // input never appeared): click the switch again until the file button shows.
  for (let tries = 0; !(await page.getByTestId('job-file').isVisible()) && tries < 5; tries++) {
    await page.getByText('Upload a CSV file').click();
    await page
      .getByTestId('job-file')
      .waitFor({ timeout: 3000 })
      .catch(() => undefined);
  }
}

/** Escape closes a drawer only while the focus is inside it; its close button always does. */
async function closeDrawer(): Promise<void> {
  await noToasts();
  await page.locator('.ant-drawer-open .ant-drawer-close').click();
  await page.locator('.ant-drawer-open').waitFor({ state: 'detached' });
}

/** The element with the focus, named by its test id, else by its text. */
const focused = () => page.evaluate<string>(`(e => e?.getAttribute('data-testid') || e?.textContent || '')(document.activeElement)`);

/**
 * Opens a dialog from the keyboard (the focus on `opener`, Enter), closes it with Escape or its Cancel
 * button, and returns what has the focus then: `name`, the opener's test id or text, when it came back.
 */
async function focusAfter(opener: Locator, name: string, close: 'Escape' | 'Cancel'): Promise<string> {
  await noToasts();
  await opener.focus();
  await page.keyboard.press('Enter');
  const dialog = page.locator('.ant-modal-wrap').filter({ visible: true });
  await dialog.waitFor();
  await settle();
  if (close === 'Escape') await page.keyboard.press('Escape');
  else await dialog.getByRole('button', { name: 'Cancel' }).click();
  await dialog.waitFor({ state: 'hidden' });
  return eventually(focused, (v) => v === name, 2000);
}

/** As focusAfter, for a drawer: closed with Escape or its close button (×). */
async function focusAfterDrawer(opener: Locator, name: string, close: 'Escape' | 'Close'): Promise<string> {
  await noToasts();
  await opener.focus();
  await page.keyboard.press('Enter');
  const drawer = page.locator('.ant-drawer-open');
  await drawer.waitFor();
  await settle();
  if (close === 'Escape') await page.keyboard.press('Escape');
  else await drawer.locator('.ant-drawer-close').click();
  await drawer.waitFor({ state: 'detached' });
  return eventually(focused, (v) => v === name, 2000);
}

async function shot(name: string): Promise<void> {
  await settle();
  await page.screenshot({ path: `${SHOTS}/${name}.png`, fullPage: true });
}

async function grab(userId: string, key = `${userId}-1`, coupon = couponId): Promise<number> {
  const res = await request(t.url)
    .post(`/coupons/${coupon}/grab`)
    .set(bearer(tokenFor(userId)))
    .set('Idempotency-Key', key);
  return res.status;
}

/**
 * Where the live page's chart is drawn: its canvas's box and its card's, and how many pixels of
 * bars (greenish: issued, antialiased when thin) lie in the newest fifth of the plot that the card
 * shows. A canvas sized once, before the page settled, and never again, was wider than its card:
 * the newest bars and the Remaining axis were cut off while the figures above counted the grabs.
 */
interface ChartPlacement {
  canvas: { x: number; width: number };
  card: { x: number; width: number };
  inside: boolean;
  newestBarPixels: number;
}
async function chartPlacement(tab: Page): Promise<ChartPlacement> {
  return tab.evaluate<ChartPlacement>(`(() => {
    const chart = document.querySelector('[data-testid="live-chart"]');
    const canvas = chart.querySelector('canvas');
    const c = canvas.getBoundingClientRect();
    const k = chart.closest('.ant-card').getBoundingClientRect();
    // The plot's margins, in CSS pixels: grid { left: 56, right: 64, top: 40, bottom: 32 } in CampaignLive.tsx.
    const plotRight = c.right - 64;
    const from = plotRight - (c.width - 120) / 5;
    const to = Math.min(plotRight, k.right);
    const scale = canvas.width / c.width;
    let newestBarPixels = 0;
    if (to > from) {
      const x0 = Math.floor((from - c.left) * scale);
      const w = Math.max(1, Math.floor((to - from) * scale));
      const y0 = Math.floor(40 * scale);
      const h = Math.floor((c.height - 72) * scale);
      const d = canvas.getContext('2d').getImageData(x0, y0, w, h).data;
      for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 0 && d[i + 1] - d[i] > 30 && d[i + 1] - d[i + 2] > 30) newestBarPixels++;
    }
    const round = (r) => ({ x: Math.round(r.x), width: Math.round(r.width) });
    return {
      canvas: round(c),
      card: round(k),
      inside: c.left >= k.left && c.right <= k.right + 0.5,
      newestBarPixels,
    };
  })()`);
}

beforeAll(async () => {
  // The console the server serves is the one built from this tree, not whatever an earlier build left,
  // and built as `npm run build` does: Vite keeps jest's NODE_ENV=test, which builds React's development
  // mode, whose StrictMode mounts everything twice and loses the focus of dialogs that have just opened.
  execFileSync(process.execPath, ['node_modules/vite/bin/vite.js', 'build', '--config', 'console/vite.config.ts', '--logLevel', 'error'], {
    stdio: 'inherit',
    env: { ...process.env, NODE_ENV: 'production' },
  });
  mkdirSync(SHOTS, { recursive: true });
  t = await startTestApp({ WEBHOOK_RELAY_ENABLED: 'true' });
  receiver = await new WebhookReceiver().start();
  browser = await launchChromium();
  page = await newTab();
  watchErrors(page);
}, 120_000);

/** A tab in a browser context of its own, running `initScript` before the page's scripts when given. */
async function newTab(initScript?: string): Promise<Page> {
  const context = await browser.newContext({ viewport: { width: 1440, height: 900 }, locale: 'en-US' });
  // Same origin only: any request elsewhere would fail this test.
  await context.route(
    (url) => !url.href.startsWith(t.url),
    (route) => route.abort(),
  );
  if (initScript) await context.addInitScript(initScript);
  return context.newPage();
}

/** Any page error or console error of `tab` fails the test it happens in (afterEach). */
function watchErrors(tab: Page): void {
  tab.on('pageerror', (err) => pageErrors.push(err.message));
  tab.on('console', (msg) => {
    // A refusal the page shows (a 4xx) is logged by the browser too; only other errors count.
    if (msg.type() === 'error' && !/status of 4\d\d/.test(msg.text())) pageErrors.push(msg.text());
  });
}

afterEach(async () => {
  // What the page showed when the test ended, for a look when one fails.
  await page.screenshot({ path: `${SHOTS}/last.png` });
  // A page that threw or logged an error failed, whatever it still shows.
  expect(pageErrors.splice(0)).toEqual([]);
});

afterAll(async () => {
  await browser?.close();
  await t?.close();
  await receiver?.close();
});

describe('admin console in a browser', () => {
  it('is served at /console with a strict same-origin policy, and deep links get the app', async () => {
    const res = await request(t.url).get('/console');
    expect(res.status).toBe(200);
    expect(res.headers['content-type']).toMatch(/text\/html/);
    expect(res.headers['content-security-policy']).toContain("default-src 'self'");
    const asset = /\/console\/assets\/[^"]+\.js/.exec(res.text)?.[0];
    expect(asset).toBeDefined();
    const js = await request(t.url).get(asset as string);
    expect(js.status).toBe(200);
    expect(js.headers['cache-control']).toContain('immutable');
    // The build's compressed copies go to the browsers that take them (supertest would decode them).
    const raw = async (acceptEncoding: string) => {
      const r = await undici.request(`${t.url}${asset as string}`, { headers: { 'accept-encoding': acceptEncoding } });
      return { encoding: r.headers['content-encoding'], vary: r.headers.vary, bytes: Buffer.from(await r.body.arrayBuffer()) };
    };
    const plain = await raw('identity');
    expect([plain.encoding, plain.vary]).toEqual([undefined, 'accept-encoding']);
    const br = await raw('gzip, deflate, br, zstd');
    expect([br.encoding, br.vary]).toEqual(['br', 'accept-encoding']);
    expect(brotliDecompressSync(br.bytes).equals(plain.bytes)).toBe(true);
    expect(br.bytes.length).toBeLessThan(plain.bytes.length / 3);
    const gz = await raw('gzip');
    expect(gz.encoding).toBe('gzip');
    expect(gunzipSync(gz.bytes).equals(plain.bytes)).toBe(true);
    for (const copy of ['br', 'gz']) expect((await request(t.url).get(`${asset as string}.${copy}`)).status).toBe(404);
    expect((await request(t.url).get('/console/campaigns/7')).text).toBe(res.text);
    expect((await request(t.url).get('/console/assets/missing.js')).status).toBe(404);
  });

  it('signs in from #token, which leaves the address bar for sessionStorage', async () => {
    const token = adminToken();
    await page.goto(`${t.url}/console/#token=${token}`);
    await page.getByText('Signed in as admin-1').waitFor();
    expect(page.url()).toBe(`${t.url}/console/campaigns`);
    expect(await page.evaluate(`sessionStorage.getItem('coupon-console.token')`)).toBe(token);
  });

  it('signs in from a #token opened in a tab already on the console, which leaves the address bar too', async () => {
    const other = tokenFor('admin-2', ['admin'], 600);
    // Only the fragment changes: the page does not load again.
    await page.evaluate(`location.hash = 'token=${other}'`);
    await page.getByText('Signed in as admin-2').waitFor();
    expect(page.url()).toBe(`${t.url}/console/campaigns`);
    expect(await page.evaluate(`sessionStorage.getItem('coupon-console.token')`)).toBe(other);
  });

  it('goes back to the sign-in page the moment a signed-in token expires', async () => {
    // Its own tab with a fake clock: the page's expiry timer fires when the clock passes `exp`.
    const tab = await browser.newPage({ viewport: { width: 1440, height: 900 } });
    try {
      await tab.clock.install();
      await tab.goto(`${t.url}/console/#token=${tokenFor('admin-1', ['admin'], 60)}`);
      await tab.getByText('Signed in as admin-1').waitFor();
      await tab.clock.fastForward('01:01');
      await tab.getByTestId('signin-notice').waitFor();
      expect(await tab.getByTestId('signin-notice').textContent()).toContain('expired');
      expect(await tab.evaluate(`sessionStorage.getItem('coupon-console.token')`)).toBeNull();
    } finally {
      await tab.close();
    }
  });

  it('keeps a token of 31 days signed in (past the 24.8 days a browser timer can wait), and still signs it out when it expires', async () => {
    const tab = await browser.newPage({ viewport: { width: 1440, height: 900 } });
    try {
      await tab.clock.install();
      await tab.goto(`${t.url}/console/#token=${tokenFor('admin-31d', ['admin'], 31 * 86_400)}`);
      await tab.getByText('Signed in as admin-31d').waitFor();
      await tab.clock.runFor(1000);
      expect(await tab.getByText('Signed in as admin-31d').isVisible()).toBe(true);
      await tab.clock.fastForward(31 * 86_400_000 + 60_000);
      await tab.getByTestId('signin-notice').waitFor();
      expect(await tab.getByTestId('signin-notice').textContent()).toContain('expired');
    } finally {
      await tab.close();
    }
  });

  it('refuses an expired token at the door, and takes a pasted admin token', async () => {
    await page.evaluate('sessionStorage.clear()');
    const expired = tokenFor('admin-1', ['admin'], 1);
    await new Promise((r) => setTimeout(r, 1100));
    await page.goto(`${t.url}/console/#token=${expired}`);
    await page.getByTestId('signin-notice').waitFor();
    expect(await page.getByTestId('signin-notice').textContent()).toContain('expired');
    await shot('01-sign-in');
    await page.getByLabel('Admin token').fill(tokenFor('user-1', [], 600));
    await page.getByRole('button', { name: 'Sign in' }).click();
    expect(await page.getByTestId('signin-notice').textContent()).toContain('no admin role');
    await page.getByLabel('Admin token').fill(adminToken());
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByText('Signed in as admin-1').waitFor();
  });

  it('creates a campaign in the form, showing the API’s validation messages', async () => {
    await page.getByTestId('new-campaign').click();
    await page.getByTestId('field-name').fill('Double 11: spend ¥100 save ¥10');
    // A stock of 2.5 is refused as typed, not rounded to 3 and sent.
    await page.getByTestId('field-totalStock').fill('2.5');
    await page.getByTestId('create-submit').click();
    await page.getByText('A whole number', { exact: true }).waitFor();
    await page.getByTestId('field-totalStock').fill('50');
    await page.getByTestId('field-validity-days').fill('0');
    await page.getByLabel('Discount (¥)').fill('0');
    await settle();
    await page.getByTestId('create-submit').click();
    // The message is the API's (class-validator's wording), placed under the field it names, which its
    // label names rather than the body's field name; one on money in the yuan the form takes, not cents.
    await page.getByText('Must not be less than 1', { exact: true }).waitFor();
    await page.getByText('Must not be less than ¥0.01').waitFor();
    // ¥10.005 is refused as typed, not rounded to ¥10.01 and sent as 1001 cents.
    await page.getByLabel('Discount (¥)').fill('10.005');
    await page.getByTestId('create-submit').click();
    await page.getByText('At most two decimals (whole fen)', { exact: true }).waitFor();
    await page.getByLabel('Discount (¥)').fill('10');
    await shot('02-create-validation');
    await page.getByTestId('field-validity-days').fill('7');
    await settle();
    await page.getByTestId('create-submit').click();
    const listed = async () =>
      (await request(t.url).get('/admin/coupons').set(bearer(adminToken()))).body.items as {
        id: string;
        name: string;
        initStock: number;
        discount: { amountCents: number };
      }[];
    const [row] = await eventually(listed, (items) => items.length > 0);
    expect(row.name).toBe('Double 11: spend ¥100 save ¥10');
    expect(row.discount.amountCents).toBe(1000);
    couponId = row.id;
    expect(row.initStock).toBe(50);
    await page.getByTestId(`campaign-${couponId}`).waitFor();
    expect(await page.getByTestId('stock-bar').first().getAttribute('data-remaining')).toBe('50');
    // The grab window names its years.
    const listedRow = page.locator('.ant-table-row', { has: page.getByTestId(`campaign-${couponId}`) });
    expect(await listedRow.getByText(/^Grab window:/).textContent()).toMatch(
      /^Grab window: \d{4}-\d\d-\d\d \d\d:\d\d UTC[+-]\d\d:\d\d → \d{4}-\d\d-\d\d \d\d:\d\d UTC[+-]\d\d:\d\d$/,
    );
  });

  it('creates a PERCENT campaign with a cap that stacks, the API judging the percentage', async () => {
    await page.getByTestId('new-campaign').click();
    await page.getByTestId('field-name').fill('Members: 15% off, at most ¥20');
    await page.getByText('Percent off', { exact: true }).click();
    await page.getByTestId('field-percentOff').fill('150');
    await page.getByTestId('field-maxDiscount').fill('20');
    await page.getByTestId('field-stackable').click();
    await settle();
    await page.getByTestId('create-submit').click();
    await page.getByText('Must not be greater than 100', { exact: true }).waitFor();
    await page.getByTestId('field-percentOff').fill('15');
    // What the shopper pays, beside the percentage off: a shop that says 打 8.5 折 must not type 85 here.
    await page.getByText('The shopper pays 85% of the order').waitFor();
    await settle();
    await page.getByTestId('create-submit').click();
    const listed = async () =>
      (await request(t.url).get('/admin/coupons').set(bearer(adminToken()))).body.items as {
        id: string;
        name: string;
        discount: unknown;
        stackable: boolean;
      }[];
    const items = await eventually(listed, (all) => all.length > 1);
    const created = items.find((c) => c.name === 'Members: 15% off, at most ¥20');
    expect(created).toMatchObject({
      discount: { type: 'PERCENT', thresholdCents: 10000, percentOff: 15, maxDiscountCents: 2000 },
      stackable: true,
    });
    percentCouponId = created!.id;
    await page.getByTestId(`campaign-${percentCouponId}`).waitFor();
  });

  it('creates a webhook and shows its signing secret once', async () => {
    await page.getByRole('menuitem', { name: 'Webhooks' }).click();
    await page.getByTestId('new-webhook').click();
    await page.getByTestId('webhook-url').fill(receiver.url);
    await settle();
    await page.getByTestId('webhook-submit').click();
    const secret = page.getByTestId('webhook-secret');
    await secret.waitFor();
    // The receiver verifies every delivery's signature with the secret exactly as the page shows it.
    receiver.secret = (await secret.textContent())?.trim();
    expect(receiver.secret).toMatch(/^whsec_/);
    await shot('10-webhook-secret');
    await page.getByRole('button', { name: 'OK', exact: true }).click();
    await page.getByText(receiver.url).waitFor();
    await page.getByRole('menuitem', { name: 'Campaigns' }).click();
  });

  it('shows grabs made through the API: the stock bar drains and the chart counts them', async () => {
    expect(await grab('alice')).toBe(201);
    const statuses = await Promise.all(Array.from({ length: 14 }, (_, i) => grab(`fan-${i}`)));
    expect(statuses.every((s) => s === 201)).toBe(true);
    await page.getByTestId(`campaign-${couponId}`).click();
    // The list shows a bar per campaign: read the live page's one only.
    await page.getByTestId('live-title').waitFor();
    const bar = page.getByTestId('stock-bar');
    const remaining = () => bar.getAttribute('data-remaining');
    expect(await eventually(remaining, (v) => v === '35')).toBe('35');
    // More grabs while the page is open: it follows without a reload, refusals included.
    await Promise.all(Array.from({ length: 10 }, (_, i) => grab(`late-${i}`)));
    expect(await grab('alice', 'alice-2')).toBe(409);
    expect(await eventually(remaining, (v) => v === '25')).toBe('25');
    const recent = async () => Number(await page.getByTestId('live-recent').locator('.ant-statistic-content-value').textContent());
    expect(await eventually(recent, (n) => n >= 11)).toBeGreaterThanOrEqual(11);
    await page.getByTestId('live-chart').locator('canvas').first().waitFor();
    // What the chart draws, read from the summary ECharts puts on it for screen readers.
    const chart = () => page.getByTestId('live-chart').locator('[aria-label]').first().getAttribute('aria-label');
    expect(await eventually(chart, (v) => (v ?? '').includes('Issued 25,'))).toBe(
      'Grab answers in the last 5 min: Issued 25, Limit reached 1. Remaining stock 25.',
    );
    const series = await request(t.url).get(`/admin/coupons/${couponId}/series?seconds=60`).set(bearer(adminToken()));
    expect(series.status).toBe(200);
    expect(series.body.remainingStock).toBe(25);

    expect((series.body.outcomes.ISSUED as number[]).reduce((a, b) => a + b, 0)).toBe(25);
    expect((series.body.outcomes.USER_LIMIT_REACHED as number[]).reduce((a, b) => a + b, 0)).toBe(1); // The counts are a full count, refreshed every 10 s or on demand.
    await page.getByTestId('counts-refresh').click();
    const issued = async () => Number(await page.getByTestId('count-issued').locator('.ant-statistic-content-value').textContent());
    expect(await eventually(issued, (n) => n === 25)).toBe(25);
    await page.getByTestId('live-window').getByText('1 min').click();
    await page.waitForTimeout(1200);
    // The whole chart in its card, the grabs just made drawn at its right end.
    const placed = await chartPlacement(page);
    expect(placed).toEqual({ ...placed, inside: true, newestBarPixels: expect.any(Number) });
    expect(placed.newestBarPixels).toBeGreaterThan(0);
    await shot('03-campaign-live');
    // Pause: grabs are refused while the tag says so; resume: they go through again.
    await page.getByRole('button', { name: 'Pause' }).click();
    await settle();
    await page.getByTestId('pause-confirm').click();
    await page.locator('.ant-tag', { hasText: 'Paused' }).waitFor();
    expect(await grab('paused-fan')).toBe(409);
    await page.getByRole('button', { name: 'Resume' }).click();
    await page.locator('.ant-tag', { hasText: 'Running' }).waitFor();
    expect(await grab('paused-fan', 'paused-fan-2')).toBe(201);
    expect(await eventually(remaining, (v) => v === '24')).toBe('24');
    // Add stock: 10 more, and the bar follows.
    await page.getByRole('button', { name: 'Stock', exact: true }).click();
    await page.getByTestId('stock-amount').fill('10');
    await settle();
    await page.getByTestId('stock-submit').click();
    expect(await eventually(remaining, (v) => v === '34')).toBe('34');
    await page.getByRole('button', { name: 'Back' }).click();
    await page.getByTestId(`campaign-${couponId}`).waitFor();
    await shot('04-campaigns');
  });

  it('a user id the service refuses shows its error alone: no coupons listed as none, no title naming it, no Reissue', async () => {
    await page.goto(`${t.url}/console/users#token=${adminToken()}`);
    await page.getByTestId('user-search').locator('input').fill('a b');
    await page.getByTestId('user-search').locator('input').press('Enter');
    const card = page.locator('.ant-card').first();
    await card.locator('.ant-alert-error').waitFor();
    expect(await card.locator('.ant-alert-error').textContent()).toMatch(/userId/);
    expect([
      await card.locator('.ant-card-head-title').textContent(),
      await card.getByText('This user has no coupons').count(),
      await card.getByRole('button', { name: 'Reissue' }).count(),
    ]).toEqual(['User coupons', 0, 0]);
  });

  it('voids a user’s coupon with a reason and shows its timeline', async () => {
    await page.getByRole('menuitem', { name: 'User coupons' }).click();
    await page.getByTestId('user-search').locator('input').fill('alice');
    await page.getByTestId('user-search').locator('input').press('Enter');
    const [uc] = (await request(t.url).get('/admin/users/alice/coupons').set(bearer(adminToken()))).body.items as { id: string }[];
    await page.getByTestId(`void-${uc.id}`).click();
    await page.getByTestId('action-reason').fill('Fraud report #4411');
    await settle();
    await page.getByTestId('action-submit').click();
    const timeline = page.getByTestId('timeline');
    await timeline.getByText('Fraud report #4411').waitFor();
    expect(await timeline.locator('.ant-timeline-item').count()).toBe(2);
    expect(await page.getByTestId('history-consistency').textContent()).toContain('Consistent');
    const history = await request(t.url).get(`/admin/user-coupons/${uc.id}/history`).set(bearer(adminToken()));
    expect(history.body.userCoupon.status).toBe('VOID');
    await shot('05-coupon-timeline');
    await page.keyboard.press('Escape');
    // Reissue in its place, with a reason: a new REISSUE coupon in the list.
    await page.getByRole('button', { name: 'Reissue' }).nth(1).click();
    await page.getByTestId('action-reason').fill('Replacement after the fraud check');
    await settle();
    await page.getByTestId('action-submit').click();
    await page.getByText(`replaces ${uc.id}`, { exact: true }).waitFor();
    const after = (await request(t.url).get('/admin/users/alice/coupons').set(bearer(adminToken()))).body.items as {
      id: string;
      source: string;
      status: string;
      replacesUserCouponId: string | null;
    }[];
    expect(after.map((c) => [c.source, c.status, c.replacesUserCouponId])).toEqual([
      ['REISSUE', 'UNUSED', uc.id],
      ['GRAB', 'VOID', null],
    ]);
    // Replaced once, it cannot be replaced again (the API would answer ALREADY_REPLACED); the new one says what it replaces.
    expect(await page.getByTestId(`reissue-${uc.id}`).isDisabled()).toBe(true);
    expect(await page.getByTestId(`reissue-${uc.id}`).getAttribute('title')).toBe(`Replaced already, by user coupon ${after[0].id}`);
    await shot('06-user-coupons');
  });

  it('reissues once when the operator submits again after a lost answer, told the reissue may have been made', async () => {
    await page.getByTestId('user-search').locator('input').fill('retry-1');
    await page.getByTestId('user-search').locator('input').press('Enter');
    await page.getByText('Coupons of retry-1').waitFor();
    await page.getByText('This user has no coupons').waitFor();
    await page.locator('.ant-card-extra').getByRole('button', { name: 'Reissue' }).click();
    await page.locator('.ant-modal input#couponId').fill(percentCouponId);
    await page.getByTestId('action-reason').fill('Lost parcel');
    await settle();
    // The server reissues, but its answer never reaches the page.
    await loseAnswer('**/admin/user-coupons/reissue', 'lost');
    await page.getByTestId('action-submit').click();
    await expectMaybeMade('.ant-modal');
    expect((await request(t.url).get('/admin/users/retry-1/coupons').set(bearer(adminToken()))).body.items).toHaveLength(1);
    await page.getByTestId('action-submit').click();
    await page.getByRole('cell', { name: 'Reissue', exact: true }).waitFor();
    const issued = (await request(t.url).get('/admin/users/retry-1/coupons').set(bearer(adminToken()))).body.items as unknown[];
    expect(issued).toHaveLength(1);
    forgetLogged('net::ERR_FAILED');
  });

  it('lists the webhook’s deliveries, the void among them', async () => {
    // Every state-log row is one event: wait until all of them arrived.
    const [{ n }] = (await t.db.query('SELECT COUNT(*) AS n FROM user_coupon_state_log')) as { n: string }[];
    await receiver.waitFor(() => receiver.accepted.length >= Number(n), 15_000);
    expect(receiver.accepted.some((r) => r.event.type === 'user_coupon.voided')).toBe(true);
    expect(receiver.badSignatures).toBe(0);
    await page.getByRole('menuitem', { name: 'Webhooks' }).click();
    await page.locator('[data-testid^="deliveries-"]').first().click();
    const deliveries = page.getByTestId('deliveries');
    await deliveries.getByText('user_coupon.voided').waitFor();
    expect(await deliveries.locator('.ant-tag', { hasText: 'Delivered' }).count()).toBe(receiver.accepted.length);
    await shot('11-webhook-deliveries');
    await page.keyboard.press('Escape');
  });

  it('sends a delivery again from its row: the receiver gets it once more, under the same webhook-id', async () => {
    await page.locator('[data-testid^="deliveries-"]').first().click();
    const row = page.getByTestId('deliveries').locator('tr', { hasText: 'user_coupon.voided' });
    await row.waitFor();
    const before = receiver.accepted.length;
    const voided = receiver.accepted.find((r) => r.event.type === 'user_coupon.voided');
    await row.getByRole('button', { name: 'Send again' }).click();
    await page.getByText('1 sent again').waitFor();
    await receiver.waitFor(() => receiver.accepted.length === before + 1, 15_000);
    expect(receiver.accepted[before].webhookId).toBe(voided?.webhookId);
    // None failed: sending the failed ones again sends nothing, after a confirmation, and says why rather than "0 sent again".
    await page.getByTestId('redeliver-failed').click();
    await page.locator('.ant-popconfirm').getByRole('button', { name: 'Send again' }).click();
    await page.getByText('No delivery has failed for good', { exact: false }).waitFor();
    // Nothing left for the relay to send (its outcome of the resend written, nothing made due): so nothing more arrives later.
    const pending = async () =>
      Number(((await t.db.query(`SELECT COUNT(*) AS n FROM webhook_delivery WHERE status = 'PENDING'`)) as { n: string }[])[0].n);
    for (const until = Date.now() + 10_000; (await pending()) > 0 && Date.now() < until;) await new Promise((r) => setTimeout(r, 50));
    expect(await pending()).toBe(0);
    expect(receiver.accepted).toHaveLength(before + 1);
    // A delivery pending after a failed attempt is being retried, not waiting for its first try.
    const [{ id: retried }] = (await t.db.query(`SELECT MIN(id) AS id FROM webhook_delivery`)) as { id: string }[];
    await t.db.query(
      `UPDATE webhook_delivery SET status = 'PENDING', attempts = 1, next_attempt_at = NOW() + INTERVAL 1 HOUR WHERE id = ?`,
      [retried],
    );
    await page.getByTestId('deliveries').locator('.ant-tag', { hasText: 'Retrying' }).waitFor();
    await t.db.query(`UPDATE webhook_delivery SET status = 'DELIVERED', next_attempt_at = NULL WHERE id = ?`, [retried]);
    await page.locator('.ant-drawer-open .ant-drawer-close').click();
    await page.locator('.ant-drawer-open').waitFor({ state: 'detached' });
  });

  it('opens a dialog afresh: no refused webhook URL kept, no deliveries filter carried to another webhook', async () => {
    // Nothing listens on the discard port; deleted before any event could be sent to it.
    const other = await request(t.url).post('/admin/webhooks').set(bearer(adminToken())).send({ url: 'http://127.0.0.1:9/other' });
    expect(other.status).toBe(201);
    try {
      await page.goto(`${t.url}/console/webhooks`);
      await refuseWebhookUrl('Must not contain credentials');
      await page.getByTestId('new-webhook').click();
      await page.getByTestId('webhook-url').waitFor();
      expect(await page.getByTestId('webhook-url').inputValue()).toBe('');
      expect(await page.getByText('Must not contain credentials').count()).toBe(0);
      await page.keyboard.press('Escape');
      await page.locator('.ant-modal').first().waitFor({ state: 'hidden' });
      // Failed ones of the first webhook, then the other webhook: all of its deliveries, not its failed ones.
      const chosen = page.locator('.ant-drawer-open .ant-segmented-item-selected');
      await page.locator('[data-testid^="deliveries-"]').first().click();
      await page.locator('.ant-drawer-open .ant-segmented').getByText('Failed', { exact: true }).click();
      expect(
        await eventually(
          async () => (await chosen.textContent()) ?? '',
          (v) => v === 'Failed',
        ),
      ).toBe('Failed');
      await page.locator('.ant-drawer-open .ant-drawer-close').click();
      await page.locator('.ant-drawer-open').waitFor({ state: 'detached' });
      await page.getByTestId(`deliveries-${other.body.id}`).click();
      await page.locator('.ant-drawer-open').waitFor();
      expect(await chosen.textContent()).toBe('All');
      await page.locator('.ant-drawer-open .ant-drawer-close').click();
      await page.locator('.ant-drawer-open').waitFor({ state: 'detached' });
    } finally {
      expect((await request(t.url).delete(`/admin/webhooks/${other.body.id}`).set(bearer(adminToken()))).status).toBe(204);
    }
  });

  it('starts a reconciliation, shows the discrepancy and approves its compensation', async () => {
    // A lost deduction: stock says two fewer than were ever issued from it.
    await t.db.query('UPDATE coupon_stock SET stock = stock - 2 WHERE coupon_id = ?', [couponId]);
    await page.getByRole('menuitem', { name: 'Reconciliation' }).click();
    await page.getByTestId('start-run').click();
    // The finding by its name, its code the tag's title.
    await page.getByTitle('STOCK_MISMATCH').getByText('Stock mismatch: 1').waitFor({ timeout: 20_000 });
    const approve = page.locator('[data-testid^="approve-"]');
    await approve.waitFor();
    // The campaign by its name as well as its id, linking to its page.
    const campaign = page.getByTestId(`campaign-ref-${couponId}`).first();
    await campaign.getByText(`#${couponId} Double 11: spend ¥100 save ¥10`).waitFor();
    expect(await campaign.getAttribute('href')).toBe(`/console/campaigns/${couponId}`);
    await shot('07-reconciliation-run');
    await approve.click();
    await settle();
    await page.getByTestId('decide-submit').click();
    await page.getByText('A reason is required').waitFor();
    await page.getByTestId('decide-reason').fill('Checked the order log: two deductions were lost');
    await settle();
    await page.getByTestId('decide-submit').click();
    await page.locator('.ant-tag', { hasText: 'Done' }).waitFor();
    const [stock] = (await t.db.query('SELECT stock FROM coupon_stock WHERE coupon_id = ?', [couponId])) as { stock: string }[];
    expect(Number(stock.stock)).toBe(34);
    await page.locator('.ant-table-row', { hasText: 'Restore stock' }).click();
    await page.getByText('What was done').waitFor();
    // What reconciliation wrote, its keys in words: the details', the action's and the result's.
    const labels = page.locator('.ant-table-expanded-row .ant-descriptions-item-label');
    for (const named of ['Issued from stock', 'Difference', 'Units', 'Action performed'])
      await labels.getByText(named, { exact: true }).first().waitFor();
    expect(await labels.allTextContents()).not.toContain('issuedFromStock');
    // The action lists only what the details above it do not already say.
    expect((await labels.allTextContents()).filter((l) => l === 'Remaining stock')).toHaveLength(1);
    await shot('08-compensation-done');
  });

  it('rejects a compensation with a reason, changing nothing', async () => {
    // Stock above what the ledger allows: the run proposes removing it, the operator says no.
    await t.db.query('UPDATE coupon_stock SET stock = stock + 3 WHERE coupon_id = ?', [percentCouponId]);
    const started = await request(t.url).post('/admin/reconciliation/runs').set(bearer(adminToken()));
    expect(started.status).toBe(202);
    const run = async () => (await request(t.url).get(`/admin/reconciliation/runs/${started.body.runId}`).set(bearer(adminToken()))).body;
    expect((await eventually(run, (r) => r.status !== 'RUNNING', 20_000)).status).toBe('COMPLETED');
    const pending = (await request(t.url).get('/admin/compensations?status=PENDING').set(bearer(adminToken()))).body.items as {
      id: string;
    }[];
    expect(pending).toHaveLength(1);
    await page.getByRole('menuitem', { name: 'Compensations' }).click();
    await page.getByTestId(`reject-${pending[0].id}`).click();
    await settle();
    await page.getByTestId('decide-reason').fill('Stock was added by the warehouse on purpose');
    await settle();
    // The server rejects it, but its answer never reaches the page: maybe decided, not an error.
    await loseAnswer(`**/admin/compensations/${pending[0].id}/reject`, 'lost');
    await page.getByTestId('decide-submit').click();
    await expectMaybeMade('.ant-modal');
    // Pressed again, the server says it is already rejected, as asked: the dialog closes as if answered.
    await page.getByTestId('decide-submit').click();
    await page.getByText(`Compensation ${pending[0].id} rejected`).waitFor();
    await page.getByTestId(`reject-${pending[0].id}`).waitFor({ state: 'detached' });
    await page.locator('.ant-modal').waitFor({ state: 'hidden' });
    forgetLogged('net::ERR_FAILED');
    const [rejected] = (await request(t.url).get('/admin/compensations?status=REJECTED').set(bearer(adminToken()))).body.items as {
      id: string;
      decisionReason: string;
    }[];
    expect(rejected).toMatchObject({ id: pending[0].id, decisionReason: 'Stock was added by the warehouse on purpose' });
    const [stock] = (await t.db.query('SELECT stock FROM coupon_stock WHERE coupon_id = ?', [percentCouponId])) as { stock: string }[];
    expect(Number(stock.stock)).toBe(1003);
    // A second run proposes it again. The page, left open, shows it by polling; another operator
    // decides it first, and the refusal of this page's decision brings the list up to date.
    const again = await request(t.url).post('/admin/reconciliation/runs').set(bearer(adminToken()));
    const rerun = async () => (await request(t.url).get(`/admin/reconciliation/runs/${again.body.runId}`).set(bearer(adminToken()))).body;
    expect((await eventually(rerun, (r) => r.status !== 'RUNNING', 20_000)).status).toBe('COMPLETED');
    const [second] = (await request(t.url).get('/admin/compensations?status=PENDING').set(bearer(adminToken()))).body.items as {
      id: string;
    }[];
    await page.getByTestId(`approve-${second.id}`).waitFor({ timeout: 10_000 });
    const elsewhere = await request(t.url)
      .post(`/admin/compensations/${second.id}/reject`)
      .set(bearer(adminToken()))
      .send({ reason: 'Decided in another tab' });
    expect(elsewhere.status).toBe(200);
    await page.getByTestId(`approve-${second.id}`).click();
    await page.getByTestId('decide-reason').fill('Too late');
    await settle();
    await page.getByTestId('decide-submit').click();
    await page.getByText(/COMPENSATION_ALREADY_DECIDED/).waitFor();
    await page.getByTestId(`approve-${second.id}`).waitFor({ state: 'detached', timeout: 10_000 });
    await page.keyboard.press('Escape');
    await t.db.query('UPDATE coupon_stock SET stock = stock - 3 WHERE coupon_id = ?', [percentCouponId]);
  });

  it('says a run found nothing new, not that every table agrees, while compensations of earlier runs wait', async () => {
    await t.db.query('UPDATE coupon_stock SET stock = stock + 2 WHERE coupon_id = ?', [percentCouponId]);
    const runToEnd = async (): Promise<{ id: string; discrepancies: number }> => {
      const started = await request(t.url).post('/admin/reconciliation/runs').set(bearer(adminToken()));
      expect(started.status).toBe(202);
      const read = async () =>
        (await request(t.url).get(`/admin/reconciliation/runs/${started.body.runId}`).set(bearer(adminToken()))).body;
      const done = await eventually(read, (r) => r.status !== 'RUNNING', 20_000);
      expect(done.status).toBe('COMPLETED');
      return done;
    };
    const first = await runToEnd();
    expect(first.discrepancies).toBe(1);
    const [proposed] = (await request(t.url).get('/admin/compensations?status=PENDING').set(bearer(adminToken()))).body.items as {
      id: string;
    }[];
    // The same discrepancy, still open: the second run records nothing new.
    const second = await runToEnd();
    expect(second.discrepancies).toBe(0);
    await page.goto(`${t.url}/console/reconciliation/${second.id}`);
    const note = page.getByTestId('pending-elsewhere');
    await note.waitFor();
    expect(await note.textContent()).toContain(
      'No new discrepancies, but compensations proposed by other runs still wait for a decision: 1.',
    );
    expect(await page.getByText('every table agrees').count()).toBe(0);
    // What the run read, in money too: the uses and discount the tables hold now.
    const [uses] = (await t.db.query(`SELECT COUNT(*) AS n, SUM(discount_cents) AS d FROM redemption WHERE status = 'USED'`)) as {
      n: string;
      d: string | null;
    }[];
    const totals = page.getByTestId('run-totals');
    await totals.waitFor();
    const totalsText = (await totals.textContent()) ?? '';
    expect(totalsText).toContain(`Uses${Number(uses.n).toLocaleString('en-US')}`);
    expect(totalsText).toContain(`Discount given¥${(Number(uses.d ?? 0) / 100).toFixed(Number(uses.d ?? 0) % 100 === 0 ? 0 : 2)}`);
    await shot('07b-reconciliation-nothing-new');
    // A run's id in the list is a link inside a row that navigates: one click, one step of history.
    await page.goto(`${t.url}/console/reconciliation`);
    const link = page.getByRole('link', { name: second.id, exact: true });
    await link.waitFor();
    const steps = await page.evaluate<number>('history.length');
    await link.click();
    await page.waitForURL(`**/console/reconciliation/${second.id}`);
    await settle();
    expect(await page.evaluate<number>('history.length')).toBe(steps + 1);
    await page.goBack();
    await page.waitForURL('**/console/reconciliation');
    await page.goForward();
    await page.waitForURL(`**/console/reconciliation/${second.id}`);
    await note.getByRole('link', { name: 'Open the pending compensations' }).click();
    await page.getByTestId(`approve-${proposed.id}`).waitFor();
    const rejected = await request(t.url)
      .post(`/admin/compensations/${proposed.id}/reject`)
      .set(bearer(adminToken()))
      .send({ reason: 'Set by the test' });
    expect(rejected.status).toBe(200);
    await t.db.query('UPDATE coupon_stock SET stock = stock - 2 WHERE coupon_id = ?', [percentCouponId]);
    // Nothing waits any more: now the same run's page may say all is well.
    await page.goto(`${t.url}/console/reconciliation/${second.id}`);
    await page.getByText('No discrepancies: every table agrees.').waitFor();
    expect(await page.getByTestId('pending-elsewhere').count()).toBe(0);
  });

  it('issues a pasted list as a bulk job and shows it complete with the skipped lines; a CSV job is cancelled', async () => {
    await page.getByRole('menuitem', { name: 'Campaigns' }).click();
    await page.getByTestId(`campaign-${couponId}`).click();
    await page.getByRole('button', { name: 'Bulk issue' }).click();
    // fan-0 grabbed one already (limit 1), bulk-1 is listed twice, "bad id!" is no user id: one line,
    // not a user "bad" and a user "id!". Spaces around an id are no part of it; a blank line is no id,
    // but a line all the same: the skipped lines are numbered as the text pasted has them.
    // A header alone is no list: said under the pasted list, not above the form.
    await page.getByTestId('job-user-ids').fill('user_id\n');
    await page.getByTestId('job-reason').fill('VIP November');
    await settle();
    await page.getByTestId('job-submit').click();
    await page.locator('.ant-modal .ant-form-item-explain-error', { hasText: 'Holds no user id' }).waitFor();
    expect(await page.locator('.ant-modal .ant-alert-error').count()).toBe(0);
    await page.getByTestId('job-user-ids').fill('bulk-1\n  bulk-2 \r\n\nbulk-3\nfan-0\nbulk-1\nbad id!\n');
    await settle();
    // The server makes the job, then cannot learn whether its COMMIT took: OUTCOME_UNKNOWN.
    // The list goes up as a CSV body, the reason and the stock choice in the query.
    await loseAnswer(`**/admin/coupons/${couponId}/issuances?*`, 'unknown');
    await page.getByTestId('job-submit').click();
    await expectMaybeMade('.ant-modal');
    // Create again sends the same Idempotency-Key: one job (counted below, beside the CSV one).
    await page.getByTestId('job-submit').click();
    const detail = page.getByTestId('job-detail');
    await detail.waitFor();
    forgetLogged('status of 503');
    expect(await detail.getAttribute('data-status')).toBe('QUEUED');
    // The test server runs no runner of its own (BULK_RUNNER_ENABLED=false): run the queue here, as bulk-issuance.spec does.
    await t.app.get(IssuanceRunner).runQueued();
    await page.locator('[data-testid="job-detail"][data-status="COMPLETED"]').waitFor();
    expect(await page.getByTestId('job-issued').textContent()).toBe('3');
    const skipped = page.getByTestId('skipped-lines');
    await skipped.getByText('Repeated in the list').waitFor();
    expect(await skipped.locator('.ant-table-row').allTextContents()).toEqual([
      '5fan-0Limit reached',
      '6bulk-1Repeated in the list',
      '7bad id!Invalid user id',
    ]);
    expect((await request(t.url).get('/admin/users/bad/coupons').set(bearer(adminToken()))).body.items).toEqual([]);
    await shot('12-bulk-job');
    const jobId = (await detail.getAttribute('data-job-id')) ?? '';
    await closeDrawer();
    // From the keyboard too: the job's id is a control that takes focus and Enter.
    await page.getByTestId(`job-${jobId}`).focus();
    await page.keyboard.press('Enter');
    await page.locator('[data-testid="job-detail"][data-status="COMPLETED"]').waitFor();
    await closeDrawer();

    await openCsvJobDialog();
    // A file over the 64 MiB one job takes is refused as it is chosen, before anything goes up.
    const tooLarge = `${SHOTS}/too-large.csv`;
    writeFileSync(tooLarge, '');
    truncateSync(tooLarge, CSV_MAX_BYTES + 1);
    const uploads: string[] = [];
    const seen = (r: { url(): string }) => {
      if (r.url().includes('/issuances')) uploads.push(r.url());
    };
    page.on('request', seen);
    await page.locator('input[type=file]').setInputFiles(tooLarge);
    await page.getByText('This file is over 64 MiB').waitFor();
    await page.getByTestId('job-reason').fill('Partner list');
    await page.getByTestId('job-submit').click();
    await page.getByText('Choose a CSV file').waitFor();
    page.off('request', seen);
    rmSync(tooLarge);
    expect(uploads).toEqual([]);
    // 100,000 lines (1.1 MB): the server stores them as they arrive, for a few seconds in which the
    // dialog shows how much went up.
    const csv = `user_id\n${Array.from({ length: 100_000 }, (_, i) => `csv-${i}`).join('\n')}\n`;
    await page.locator('input[type=file]').setInputFiles({ name: 'segment.csv', mimeType: 'text/csv', buffer: Buffer.from(csv) });
    await page.getByTestId('job-reason').fill('Partner list');
    await settle();
    await page.getByTestId('job-submit').click();
    await page.locator('[data-testid="upload-progress"][data-percent="100"]').waitFor();
    await page.getByText('Sent; the server is storing the list…').waitFor();
    await page.locator('[data-testid="job-detail"][data-status="QUEUED"]').waitFor();
    const jobs = (await request(t.url).get(`/admin/issuance-jobs?couponId=${couponId}`).set(bearer(adminToken()))).body.items as {
      id: string;
      total: number;
    }[];
    expect(jobs.map((j) => j.total)).toEqual([100_000, 6]);
    // The confirm's buttons say what they do: opened by a button named Cancel, its own "Cancel" kept the job running.
    await detail.getByTestId(`cancel-job-${jobs[0].id}`).click();
    const popconfirm = page.locator('.ant-popconfirm').filter({ visible: true });
    await popconfirm.waitFor();
    await settle();
    expect(await popconfirm.getByRole('button').allTextContents()).toEqual(['Keep running', 'Stop the job']);
    await popconfirm.getByRole('button', { name: 'Keep running' }).click();
    await popconfirm.waitFor({ state: 'hidden' });
    const job = await request(t.url).get(`/admin/issuance-jobs/${jobs[0].id}`).set(bearer(adminToken()));
    expect(job.body.status).toBe('QUEUED');
    await detail.getByTestId(`cancel-job-${jobs[0].id}`).click();
    await settle();
    await page.getByTestId('cancel-job-confirm').click();
    await page.locator('[data-testid="job-detail"][data-status="CANCELLED"]').waitFor();
    // Cancelled before its first batch: every line is left, as the list of a new job that would finish it.
    const [download] = await Promise.all([page.waitForEvent('download'), detail.getByTestId('download-unprocessed').click()]);
    const left = readFileSync(await download.path(), 'utf8').split('\r\n');
    expect([download.suggestedFilename(), left.slice(0, 3), left.length]).toEqual([
      `job-${jobs[0].id}-unprocessed.csv`,
      ['user_id', 'csv-0', 'csv-1'],
      100_002,
    ]);
    await closeDrawer();
    await page.getByTestId('jobs').locator('.ant-tag', { hasText: 'Cancelled' }).waitFor();
    await shot('13-bulk-jobs');

    // A CSV saved by Chinese Excel is GBK: sent as such (it was refused as not UTF-8), its Chinese read as written.
    await openCsvJobDialog();
    const gbk = Buffer.from([...Buffer.from('user_id\nvip-gbk-1\n'), 0xc0, 0xee, 0xcb, 0xc4, ...Buffer.from('\nvip-gbk-2\n')]);
    await page.locator('input[type=file]').setInputFiles({ name: 'excel.csv', mimeType: 'text/csv', buffer: gbk });
    await page.getByText('read as GBK (GB18030)').waitFor();
    await page.getByTestId('job-reason').fill('Excel list');
    // Not from stock: the tests after this one count the campaign's stock.
    await page.getByLabel('Take it from stock').uncheck();
    await settle();
    await page.getByTestId('job-submit').click();
    await page.locator('[data-testid="job-detail"][data-status="QUEUED"]').waitFor();
    const gbkJob = (await page.getByTestId('job-detail').getAttribute('data-job-id')) ?? '';
    await t.app.get(IssuanceRunner).runQueued();
    const gbkSkipped = await request(t.url).get(`/admin/issuance-jobs/${gbkJob}/skipped`).set(bearer(adminToken()));
    expect(gbkSkipped.body.items).toEqual([{ line: 3, userId: '李四', reason: 'INVALID_USER_ID' }]);
    await closeDrawer();
  });

  it("filters a bulk job's skipped lines by reason and downloads them, of that reason or all, as the CSV the API gives", async () => {
    const jobs = (await request(t.url).get(`/admin/issuance-jobs?couponId=${couponId}`).set(bearer(adminToken()))).body.items as {
      id: string;
      total: number;
    }[];
    const jobId = jobs.find((j) => j.total === 6)?.id ?? '';
    await page.getByTestId(`job-${jobId}`).click();
    await page.locator('[data-testid="job-detail"][data-status="COMPLETED"]').waitFor();
    // A completed job left no line to finish.
    expect(await page.getByTestId('download-unprocessed').count()).toBe(0);
    const rows = page.getByTestId('skipped-lines').locator('.ant-table-row');
    await rows.nth(2).waitFor();
    await page.getByLabel('Skipped lines of one reason').click();
    await page.locator('.ant-select-item-option', { hasText: 'Repeated in the list (1)' }).click();
    // Up to 15 s: in the full run, on a loaded machine, the filtered page took longer than the default 5.
    await eventually(
      () => rows.allTextContents(),
      (r) => r.length === 1,
      15_000,
    );
    expect(await rows.allTextContents()).toEqual(['6bulk-1Repeated in the list']);
    const save = async () => {
      const [download] = await Promise.all([page.waitForEvent('download'), page.getByTestId('download-skipped').click()]);
      return { name: download.suggestedFilename(), text: readFileSync(await download.path(), 'utf8') };
    };
    expect(await save()).toEqual({ name: `job-${jobId}-skipped-DUPLICATE.csv`, text: 'user_id\r\nbulk-1\r\n' });
    // Cleared, the filter shows every reason again, and so does the file.
    await page.getByTestId('job-detail').locator('.ant-select-clear').click();
    await eventually(
      () => rows.allTextContents(),
      (r) => r.length === 3,
    );
    expect(await save()).toEqual({ name: `job-${jobId}-skipped.csv`, text: "user_id\r\nfan-0\r\nbulk-1\r\n'bad id!\r\n" });
    // Nothing skipped for this reason: nothing to download.
    await page.getByLabel('Skipped lines of one reason').click();
    await page.locator('.ant-select-item-option', { hasText: 'Sold out (0)' }).click();
    await page.getByTestId('skipped-lines').getByText('No line was skipped').waitFor();
    expect(await page.getByTestId('download-skipped').isDisabled()).toBe(true);
    await closeDrawer();
  });

  it('removes stock, refusing what is no whole number of units and more than remains', async () => {
    await page.getByRole('menuitem', { name: 'Campaigns' }).click();
    const row = page.locator('.ant-table-row', { has: page.getByTestId(`campaign-${couponId}`) });
    // 34 after the compensation, 3 of them issued by the bulk job.
    expect(
      await eventually(
        () => row.getByTestId('stock-bar').getAttribute('data-remaining'),
        (v) => v === '31',
      ),
    ).toBe('31');
    await row.getByRole('button', { name: 'Stock', exact: true }).click();
    await settle();
    await chooseRemoveStock();
    expect(await page.getByTestId('stock-remaining').textContent()).toContain('31 of 60 left');
    // What is not a whole number of units is refused as typed: not rounded, raised to 1 or ignored.
    const notWhole = page.getByText('A whole number of units, 1 or more');
    for (const typed of ['0', '2.5', 'abc']) {
      await page.getByTestId('stock-amount').fill(typed);
      await page.getByTestId('stock-submit').click();
      await notWhole.waitFor();
      expect(await page.getByTestId('stock-amount').inputValue()).toBe(typed);
    }
    await page.getByTestId('stock-amount').fill('1000');
    await notWhole.waitFor({ state: 'detached' });
    // More than remains is refused as typed, before the confirmation it used to ask first.
    await page.getByText('Only 31 remain to remove').waitFor();
    await settle();
    await page.getByTestId('stock-submit').click();
    await settle();
    expect(await page.getByTestId('confirm-ok').count()).toBe(0);
    const untouched = await request(t.url).get(`/admin/coupons/${couponId}`).set(bearer(adminToken()));
    expect([untouched.body.initStock, untouched.body.remainingStock]).toEqual([60, 31]);
    await page.getByTestId('stock-amount').fill('5');
    await settle();
    await page.getByTestId('stock-submit').click();
    await settle();
    await page.getByTestId('confirm-ok').click();
    expect(
      await eventually(
        () => row.getByTestId('stock-bar').getAttribute('data-remaining'),
        (v) => v === '26',
      ),
    ).toBe('26');
    const coupon = await request(t.url).get(`/admin/coupons/${couponId}`).set(bearer(adminToken()));
    expect([coupon.body.initStock, coupon.body.remainingStock]).toEqual([55, 26]);
    // Opened again, the dialog starts from its defaults, not from what was typed the last time.
    await row.getByRole('button', { name: 'Stock', exact: true }).click();
    await page.getByTestId('stock-amount').waitFor();
    expect(await page.getByTestId('stock-amount').inputValue()).toBe('100');
    expect(await page.locator('.ant-modal .ant-radio-button-wrapper-checked').textContent()).toBe('Add stock');
    await page.keyboard.press('Escape');
    await page.locator('.ant-modal').waitFor({ state: 'hidden' });
  });

  it('adds stock once when the operator presses OK again after a lost answer, told the change may have been made', async () => {
    const before = await remainingStock();
    await openStockDialog('7');
    // The server adds the stock, but its answer never reaches the page.
    await loseAnswer(`**/admin/coupons/${couponId}/stock`, 'lost');
    await page.getByTestId('stock-submit').click();
    await expectMaybeMade('.ant-modal');
    await resubmitStock(before + 7, 'net::ERR_FAILED');
  });

  it('shows a refusal that is not about the amount above the stock form, and an unknown outcome as maybe made', async () => {
    const before = await remainingStock();
    await openStockDialog('3');
    const underField = page.locator('.ant-modal .ant-form-item-explain-error');
    // A lock wait past its limit: nothing changed, and the amount is not why.
    await page.route(
      `**/admin/coupons/${couponId}/stock`,
      (route) =>
        route.fulfill({
          status: 503,
          contentType: 'application/json',
          body: JSON.stringify({ code: 'SERVICE_UNAVAILABLE', message: 'The database did not answer in time; retry later' }),
        }),
      { times: 1 },
    );
    await page.getByTestId('stock-submit').click();
    await page.getByTestId('form-refusal').waitFor();
    expect(await page.getByTestId('form-refusal').textContent()).toContain('SERVICE_UNAVAILABLE');
    expect(await underField.count()).toBe(0);
    expect(await page.getByTestId('no-answer').count()).toBe(0);
    expect(await remainingStock()).toBe(before);
    // The server adds the stock, then cannot learn whether its COMMIT took: OUTCOME_UNKNOWN.
    await loseAnswer(`**/admin/coupons/${couponId}/stock`, 'unknown');
    await page.getByTestId('stock-submit').click();
    await expectMaybeMade('.ant-modal');
    expect(await page.getByTestId('form-refusal').count()).toBe(0);
    // OK again sends the same Idempotency-Key: the stock changes once.
    await resubmitStock(before + 3, 'status of 503');
  });

  it('shows the stock the server has as soon as it refuses a removal of more than remains, not after the next refresh', async () => {
    const coupon = await createCoupon(t.url, { name: 'Removed elsewhere', totalStock: 20 });
    await page.goto(`${t.url}/console/campaigns#token=${adminToken()}`);
    const row = page.locator('.ant-table-row', { has: page.getByTestId(`campaign-${coupon.id}`) });
    await row.getByRole('button', { name: 'Stock', exact: true }).click();
    await settle();
    await chooseRemoveStock();
    await page.getByTestId('stock-amount').fill('15');
    expect(await page.getByTestId('stock-remaining').textContent()).toContain('20 of 20 left');
    // Right after the list's refresh, so the next is 10 s away: only the refusal can bring the figure up to date below.
    await page.waitForResponse((r) => r.url().includes('/admin/coupons?'), { timeout: 15_000 });
    // Another operator removes 10 units while this dialog is open.
    const elsewhere = await request(t.url).post(`/admin/coupons/${coupon.id}/stock`).set(bearer(adminToken())).send({ delta: -10 });
    expect(elsewhere.status).toBe(200);
    await page.getByTestId('stock-submit').click();
    await settle();
    await page.getByTestId('confirm-ok').click();
    await page.locator('.ant-modal .ant-form-item-explain-error', { hasText: 'only 10 remain' }).waitFor();
    // The campaigns list refreshes every 10 s; the dialog must not wait for it.
    expect(
      await eventually(
        async () => (await page.getByTestId('stock-remaining').textContent()) ?? '',
        (v) => v.includes('10 of 10 left'),
        2000,
      ),
    ).toContain('10 of 10 left');
    expect(await page.getByTestId('stock-amount').inputValue()).toBe('15');
    // Closed by its own Cancel: after the confirmation the focus is not in the dialog for Escape to reach it.
    const dialog = page.locator('.ant-modal', { has: page.getByTestId('stock-amount') });
    await dialog.getByRole('button', { name: 'Cancel' }).click();
    await dialog.waitFor({ state: 'hidden' });
  });

  it('creates one campaign when the operator presses Create again after a lost answer, told it may have been made', async () => {
    const name = 'Lost answer: spend ¥50 save ¥5';
    const named = async () =>
      (
        (await request(t.url).get('/admin/coupons?limit=100').set(bearer(adminToken()))).body.items as { id: string; name: string }[]
      ).filter((c) => c.name === name);
    await page.getByTestId('new-campaign').click();
    await page.getByTestId('field-name').fill(name);
    await settle();
    // The server creates the campaign, but its answer never reaches the page. (The list's reads ask
    // /admin/coupons?limit=…, which the pattern, matched whole, leaves alone.)
    await loseAnswer('**/admin/coupons', 'lost');
    await page.getByTestId('create-submit').click();
    await expectMaybeMade('.ant-drawer');
    const [made] = await named();
    expect(made).toBeDefined();
    // Create again sends the same Idempotency-Key: the same campaign, not a second one.
    await page.getByTestId('create-submit').click();
    await page.getByTestId(`campaign-${made.id}`).waitFor();
    await page.locator('.ant-drawer-open').waitFor({ state: 'detached' });
    expect(await named()).toHaveLength(1);
    forgetLogged('net::ERR_FAILED');
  });

  it('asks before pausing a live sale or removing stock, naming the campaign; cancelled, nothing is sent', async () => {
    const coupon = await createCoupon(t.url, { name: 'Asked first', totalStock: 40 });
    const read = async () =>
      (await request(t.url).get(`/admin/coupons/${coupon.id}`).set(bearer(adminToken()))).body as {
        status: string;
        remainingStock: number;
      };
    const changes: string[] = [];
    const seen = (r: { method(): string; url(): string }) => {
      if (r.method() !== 'GET' && r.url().includes(`/admin/coupons/${coupon.id}`)) changes.push(r.method());
    };
    page.on('request', seen);
    try {
      await page.goto(`${t.url}/console/campaigns/${coupon.id}#token=${adminToken()}`);
      await page.locator('.ant-tag', { hasText: 'Running' }).waitFor();
      await page.getByRole('button', { name: 'Pause' }).click();
      const pauseAsked = page.locator('.ant-popconfirm', { hasText: 'Pause Asked first? Every grab is refused until it is resumed.' });
      await pauseAsked.waitFor();
      await settle();
      await pauseAsked.getByRole('button', { name: 'Cancel' }).click();
      await pauseAsked.waitFor({ state: 'hidden' });
      expect(changes).toEqual([]);
      expect((await read()).status).toBe('ACTIVE');
      await page.getByRole('button', { name: 'Pause' }).click();
      await settle();
      await page.getByTestId('pause-confirm').click();
      await page.locator('.ant-tag', { hasText: 'Paused' }).waitFor();
      expect(changes).toEqual(['PATCH']);
      // Resuming asks nothing.
      await page.getByRole('button', { name: 'Resume' }).click();
      await page.locator('.ant-tag', { hasText: 'Running' }).waitFor();
      expect(changes).toEqual(['PATCH', 'PATCH']);

      await page.getByRole('button', { name: 'Stock', exact: true }).click();
      await settle();
      await chooseRemoveStock();
      await page.getByTestId('stock-amount').fill('5');
      await page.getByTestId('stock-submit').click();
      const removeAsked = page.locator('.ant-modal-confirm', {
        hasText: 'Remove 5 units from the stock of Asked first? They can no longer be grabbed.',
      });
      await removeAsked.waitFor();
      await settle();
      await removeAsked.getByRole('button', { name: 'Cancel' }).click();
      await removeAsked.waitFor({ state: 'detached' });
      expect(changes).toEqual(['PATCH', 'PATCH']);
      expect((await read()).remainingStock).toBe(40);
      // Still open with what was typed, for another amount or a second thought.
      expect(await page.getByTestId('stock-amount').inputValue()).toBe('5');
      await page.getByTestId('stock-submit').click();
      await settle();
      await page.getByTestId('confirm-ok').click();
      await page.locator('.ant-modal').first().waitFor({ state: 'hidden' });
      expect((await read()).remainingStock).toBe(35);
      // Adding asks nothing.
      await page.getByRole('button', { name: 'Stock', exact: true }).click();
      await page.getByTestId('stock-amount').fill('3');
      await settle();
      await page.getByTestId('stock-submit').click();
      expect(
        await eventually(
          async () => (await read()).remainingStock,
          (n) => n === 38,
        ),
      ).toBe(38);
      expect(await page.locator('.ant-modal-confirm').count()).toBe(0);
      expect(changes).toEqual(['PATCH', 'PATCH', 'POST', 'POST']);
    } finally {
      page.off('request', seen);
    }
  });

  it('shows a user’s coupons past the first 100 page by page, saying more exist', async () => {
    for (let i = 0; i < 105; i += 15) {
      const statuses = await Promise.all(
        Array.from({ length: Math.min(15, 105 - i) }, async () => {
          const res = await request(t.url)
            .post('/admin/user-coupons/reissue')
            .set(bearer(adminToken()))
            .send({ couponId: percentCouponId, userId: 'many', reason: 'Loyalty', fromStock: false });
          return res.status;
        }),
      );
      expect(statuses.every((st) => st === 201)).toBe(true);
    }
    await page.getByRole('menuitem', { name: 'User coupons' }).click();
    await page.getByTestId('user-search').locator('input').fill('many');
    await page.getByTestId('user-search').locator('input').press('Enter');
    await page.getByText('The first 100 shown; there are more').waitFor();
    const rows = page.locator('.ant-table-row');
    expect(await rows.count()).toBe(100);
    await page.getByTestId('load-more').click();
    await page.getByTestId('load-more').waitFor({ state: 'detached' });
    expect(
      await eventually(
        () => rows.count(),
        (n) => n === 105,
      ),
    ).toBe(105);
  });

  it('offers no Void for a coupon held for an order', async () => {
    const held = await grabUserCoupon(t.url, (await createCoupon(t.url, { name: 'Held one' })).id, 'holder');
    const hold = await request(t.url)
      .post('/redemptions/holds')
      .set(bearer(serviceToken()))
      .send({ userCouponId: held.id, orderNo: 'CONSOLE-HOLD-1', orderAmountCents: 20_000, userId: 'holder' });
    expect(hold.status).toBe(201);
    await page.goto(`${t.url}/console/users?userId=holder`);
    await page.getByTestId(`void-${held.id}`).waitFor();
    expect(await page.getByTestId(`void-${held.id}`).isDisabled()).toBe(true);
    expect(await page.getByTestId(`void-${held.id}`).getAttribute('title')).toMatch(/Held by an order/);
    // No replacement for a coupon the user can still use (it would give two): void first.
    expect(await page.getByTestId(`reissue-${held.id}`).isDisabled()).toBe(true);
    expect(await page.getByTestId(`reissue-${held.id}`).getAttribute('title')).toMatch(/void it first/);
  });

  it('shows a coupon as the server has it once a void is refused because an order held it meanwhile', async () => {
    const uc = await grabUserCoupon(t.url, (await createCoupon(t.url, { name: 'Held meanwhile' })).id, 'held-meanwhile');
    await page.goto(`${t.url}/console/users?userId=held-meanwhile`);
    await page.getByTestId(`void-${uc.id}`).click();
    await page.getByTestId('action-reason').fill('duplicate grant');
    await settle();
    const hold = await request(t.url)
      .post('/redemptions/holds')
      .set(bearer(serviceToken()))
      .send({ userCouponId: uc.id, orderNo: 'CONSOLE-HOLD-2', orderAmountCents: 20_000, userId: 'held-meanwhile' });
    expect(hold.status).toBe(201);
    await page.getByTestId('action-submit').click();
    await page.locator('.ant-modal .ant-alert-error', { hasText: 'COUPON_LOCKED' }).waitFor();
    await page.keyboard.press('Escape');
    await page.locator('.ant-modal').first().waitFor({ state: 'hidden' });
    // The list is read again at the refusal (it is never polled): the row says held, and Void is off.
    const row = page.locator('.ant-table-row', { has: page.getByTestId(`void-${uc.id}`) });
    await row.locator('.ant-tag', { hasText: 'Locked' }).waitFor({ timeout: 3000 });
    expect(await page.getByTestId(`void-${uc.id}`).isDisabled()).toBe(true);
  });

  it('says where a broken log breaks: the step, in words, marked on the timeline', async () => {
    const uc = await grabUserCoupon(t.url, (await createCoupon(t.url, { name: 'Broken log' })).id, 'broken-log');
    // A step written by hand that does not start where the log stands (UNUSED).
    await t.db.query(
      `INSERT INTO user_coupon_state_log (user_coupon_id, from_status, to_status, tx_id, reason, created_at) VALUES (?, 'EXPIRED', 'VOID', 'by-hand', NULL, NOW(3))`,
      [uc.id],
    );
    await page.goto(`${t.url}/console/users?userId=broken-log#token=${adminToken()}`);
    await page.getByTestId(`history-${uc.id}`).click();
    await page.getByTestId('broken-step').waitFor();
    expect(await page.getByTestId('history-consistency').textContent()).toContain(
      'Step 2 of the log, Expired → Void, is no move of the lifecycle from where the log stood: replaying stops at Unused',
    );
    expect(await page.getByTestId('broken-step').count()).toBe(1);
    await page.keyboard.press('Escape');
  });

  it('shows a coupon whose status is none of the lifecycle’s (damaged data) by its raw status, not a failed page', async () => {
    const damaged = await grabUserCoupon(t.url, (await createCoupon(t.url, { name: 'Damaged one' })).id, 'damaged');
    // The list as the API gives it for a row whose status was set by hand (what an operator investigates).
    const theirs = (url: URL) => url.pathname === '/admin/user-coupons' && url.searchParams.get('userId') === 'damaged';
    await page.route(theirs, async (route) => {
      const res = await route.fetch();
      const body = (await res.json()) as { items: { status: string }[] };
      body.items[0].status = 'BROKEN';
      await route.fulfill({ response: res, json: body });
    });
    try {
      await page.goto(`${t.url}/console/users?userId=damaged#token=${adminToken()}`);
      await page.getByRole('cell', { name: 'BROKEN', exact: true }).waitFor();
      expect(await page.getByTestId(`history-${damaged.id}`).isVisible()).toBe(true);
      expect(await page.getByText('This page failed to show').count()).toBe(0);
    } finally {
      await page.unroute(theirs);
    }
  });

  it('shows the coupons of users named `.` and `..`, which a browser cannot put in a path', async () => {
    const coupon = await createCoupon(t.url, { name: 'Dot users' });
    const dots = { '.': await grabUserCoupon(t.url, coupon.id, '.'), '..': await grabUserCoupon(t.url, coupon.id, '..') };
    for (const [userId, uc] of Object.entries(dots)) {
      await page.goto(`${t.url}/console/users?userId=${encodeURIComponent(userId)}#token=${adminToken()}`);
      await page.getByTestId(`history-${uc.id}`).waitFor();
      // Only this user's coupon: not the other dot user's, nor the coupon list that /admin/users/../coupons resolves to.
      expect(await page.getByTestId(`history-${dots[userId === '.' ? '..' : '.'].id}`).count()).toBe(0);
      expect(await page.getByText('This page failed to show').count()).toBe(0);
    }
  });

  it('says what is wrong with a user id it cannot look up, not only that validation failed', async () => {
    await page.goto(`${t.url}/console/users?userId=${encodeURIComponent('bad id!')}`);
    await page.locator('.ant-alert-error', { hasText: 'userId:' }).waitFor();
  });

  it('bulk-issues and reissues where the browser has no crypto.randomUUID (plain HTTP by address)', async () => {
    // Over plain HTTP from an address other than localhost the page is no secure context, and the
    // browser gives it no crypto.randomUUID: what this tab's init script takes away.
    const tab = await newTab('delete Crypto.prototype.randomUUID');
    watchErrors(tab);
    try {
      await tab.goto(`${t.url}/console/bulk?couponId=${percentCouponId}&new#token=${adminToken()}`);
      await tab.getByTestId('job-user-ids').fill('plain-1\nplain-2');
      await tab.getByTestId('job-reason').fill('Opened by address');
      await tab.waitForTimeout(400);
      await tab.getByTestId('job-submit').click();
      await tab.locator('[data-testid="job-detail"][data-status="QUEUED"]').waitFor();
      await t.app.get(IssuanceRunner).runQueued();
      await tab.locator('[data-testid="job-detail"][data-status="COMPLETED"]').waitFor();
      expect(await tab.getByTestId('job-issued').textContent()).toBe('2');

      await tab.goto(`${t.url}/console/users?userId=plain-3`);
      await tab.getByRole('button', { name: 'Reissue' }).click();
      await tab.locator('.ant-modal input#couponId').fill(percentCouponId);
      await tab.getByTestId('action-reason').fill('Goodwill');
      await tab.waitForTimeout(400);
      await tab.getByTestId('action-submit').click();
      await tab.getByRole('cell', { name: 'Reissue', exact: true }).waitFor();
      const coupons = (await request(t.url).get('/admin/users/plain-3/coupons').set(bearer(adminToken()))).body.items as unknown[];
      expect(coupons).toHaveLength(1);
    } finally {
      await tab.context().close();
    }
  });

  it('shows why a page failed, with a way back, instead of a white page', async () => {
    // Without any random source the bulk page cannot make its Idempotency-Key and throws while rendering.
    // React logs the error it caught: this tab's errors are expected, so not watched.
    const tab = await newTab('delete Crypto.prototype.randomUUID; delete Crypto.prototype.getRandomValues');
    try {
      await tab.goto(`${t.url}/console/bulk#token=${adminToken()}`);
      expect(await tab.getByTestId('page-error').textContent()).toMatch(/getRandomValues/);
      await tab.getByRole('menuitem', { name: 'Webhooks' }).waitFor();
      await tab.getByTestId('page-error-back').click();
      await tab.getByTestId(`campaign-${couponId}`).waitFor();
    } finally {
      await tab.context().close();
    }
  });

  it.each(['987654321', 'abc'])('stops polling a campaign that does not exist or is no id (%s), after its 404 or 400', async (id) => {
    let asked = 0;
    const count = (req: { url(): string }) => {
      if (req.url().includes(`/admin/coupons/${id}`)) asked++;
    };
    page.on('request', count);
    try {
      await page.goto(`${t.url}/console/campaigns/${id}`);
      await page.waitForTimeout(1500);
      const afterLoad = asked;
      expect(afterLoad).toBeGreaterThan(0);
      // The series was polled every second before: two more reads at least in this time.
      await page.waitForTimeout(2500);
      expect(asked).toBe(afterLoad);
      // Nothing to act on: no bulk job offered for it, as no stock or pause.
      expect(await page.getByRole('button', { name: 'Bulk issue' }).count()).toBe(0);
      expect(await page.getByRole('button', { name: 'Back' }).count()).toBe(1);
    } finally {
      page.off('request', count);
    }
  });

  it('shows a campaign as ended once its fixed validity ends, before its grab window does', async () => {
    const soon = await createCoupon(t.url, {
      name: 'Valid briefly',
      validity: {
        type: 'FIXED',
        startAt: new Date(Date.now() - 60_000).toISOString(),
        endAt: new Date(Date.now() + 3_600_000).toISOString(),
      },
    });
    await page.goto(`${t.url}/console/campaigns/${soon.id}`);
    await page.locator('.ant-tag', { hasText: 'Running' }).waitFor();
    // The validity ends now: moved in SQL rather than waited for, so a slow page load cannot miss "Running".
    await t.db.query('UPDATE coupon SET validity_end_at = UTC_TIMESTAMP(3) - INTERVAL 1 SECOND WHERE id = ?', [soon.id]);
    const ended = Date.now();
    await page.reload();
    await page.locator('.ant-tag', { hasText: 'Ended' }).waitFor();
    // Grabs may use a template up to twice COUPON_CACHE_TTL_MS old.
    await page.waitForTimeout(Math.max(0, ended + 2 * t.config.COUPON_CACHE_TTL_MS + 100 - Date.now()));
    expect(await grab('after-validity', 'after-validity', soon.id)).toBe(409);
  });

  it('drops an outcome from the chart and its legend once the window no longer has it', async () => {
    const coupon = await createCoupon(t.url, { name: 'Legend' });
    // The series as the server would give them, with what the test puts in the window.
    let outcomes: Record<string, (n: number) => number> = { ISSUED: () => 4, SOLD_OUT: () => 3 };
    await page.route(`**/admin/coupons/${coupon.id}/series**`, (route) => {
      const seconds = Number(new URL(route.request().url()).searchParams.get('seconds'));
      const body = {
        couponId: coupon.id,
        status: 'ACTIVE',
        initStock: 100,
        remainingStock: 90,
        from: new Date(Date.now() - (seconds - 1) * 1000).toISOString(),
        seconds,
        outcomes: Object.fromEntries(Object.entries(outcomes).map(([o, n]) => [o, Array.from({ length: seconds }, (_, i) => n(i))])),
      };
      return route.fulfill({ json: body });
    });
    try {
      await page.goto(`${t.url}/console/campaigns/${coupon.id}#token=${adminToken()}`);
      const summary = () => page.getByTestId('live-chart').locator('[aria-label]').first().getAttribute('aria-label');
      // Pixels of the colour sold-out bars and their legend mark are drawn in (#f5222d), on the chart's
      // canvas; null while there is no canvas (the chart not drawn yet, or being created again).
      const soldOutPixels = () =>
        page.evaluate<number | null>(`(() => {
          const c = document.querySelector('[data-testid="live-chart"] canvas');
          if (!c) return null;
          const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
          let n = 0;
          for (let i = 0; i < d.length; i += 4) if (Math.abs(d[i] - 245) + Math.abs(d[i + 1] - 34) + Math.abs(d[i + 2] - 45) < 12) n++;
          return n;
        })()`);
      expect(await eventually(summary, (v) => (v ?? '').includes('Sold out'))).toBe(
        'Grab answers in the last 5 min: Issued 1,200, Sold out 900. Remaining stock 90.',
      );
      expect(await eventually(soldOutPixels, (n) => n !== null && n > 0)).toBeGreaterThan(0);
      // Sold-out answers age out of the window: the next polls no longer have them.
      outcomes = { ISSUED: () => 4 };
      expect(await eventually(summary, (v) => !(v ?? '').includes('Sold out'))).toBe(
        'Grab answers in the last 5 min: Issued 1,200. Remaining stock 90.',
      );
      await page.waitForTimeout(1500);
      expect(await eventually(soldOutPixels, (n) => n !== null)).toBe(0);
    } finally {
      await page.unroute(`**/admin/coupons/${coupon.id}/series**`);
    }
  });

  it('labels the stock every unit added or removed counts in as total, not initial', async () => {
    const coupon = await createCoupon(t.url, { name: 'Restocked', totalStock: 50 });
    const added = await request(t.url).post(`/admin/coupons/${coupon.id}/stock`).set(bearer(adminToken())).send({ delta: 10 });
    expect(added.status).toBe(200);
    await page.goto(`${t.url}/console/campaigns/${coupon.id}#token=${adminToken()}`);
    const figure = (title: string) =>
      page.locator('.ant-statistic', { has: page.locator('.ant-statistic-header', { hasText: title }) }).locator('.ant-statistic-content');
    // 50 at creation and 10 added: the figure is 60, so "initial" would be wrong.
    await figure('Total stock, changes included').getByText('60', { exact: true }).waitFor();
    expect(await page.getByText('Initial stock').count()).toBe(0);
    await page.getByTestId('language').getByText('中文').click();
    await figure('总库存（含增减）').getByText('60', { exact: true }).waitFor();
    expect(await page.getByText('初始库存').count()).toBe(0);
    await page.getByTestId('language').getByText('English').click();
  });

  it('shows times in the operator’s time zone, saying which by its offset from UTC', async () => {
    const coupon = await createCoupon(t.url, { name: 'Zoned' });
    const { grabStartAt, grabEndAt } = (await request(t.url).get(`/admin/coupons/${coupon.id}`).set(bearer(adminToken()))).body as {
      grabStartAt: string;
      grabEndAt: string;
    };
    const context = await browser.newContext({ viewport: { width: 1440, height: 900 }, locale: 'en-US', timezoneId: 'Asia/Shanghai' });
    await context.route(
      (url) => !url.href.startsWith(t.url),
      (route) => route.abort(),
    );
    const tab = await context.newPage();
    watchErrors(tab);
    // Shanghai keeps UTC+8 all year.
    const shanghai = (iso: string, to: 16 | 19) => {
      const local = new Date(Date.parse(iso) + 8 * 3_600_000).toISOString();
      return `${local.slice(0, 10)} ${local.slice(11, to)} UTC+08:00`;
    };
    try {
      await tab.goto(`${t.url}/console/campaigns#token=${adminToken()}`);
      const row = tab.locator('.ant-table-row', { has: tab.getByTestId(`campaign-${coupon.id}`) });
      expect(await row.getByText(/^Grab window:/).textContent()).toBe(
        `Grab window: ${shanghai(grabStartAt, 16)} → ${shanghai(grabEndAt, 16)}`,
      );
      await tab.goto(`${t.url}/console/campaigns/${coupon.id}`);
      const shown = tab.locator('.ant-descriptions-row', { hasText: 'Grab window' }).locator('.ant-descriptions-item-content').first();
      await shown.waitFor();
      expect(await shown.textContent()).toBe(`${shanghai(grabStartAt, 19)} → ${shanghai(grabEndAt, 19)}`);
    } finally {
      await context.close();
    }
  });

  it('changes a campaign’s rate limit, and empties it back to the default', async () => {
    const coupon = await createCoupon(t.url, { name: 'Rate limited' });
    const stored = async () => (await request(t.url).get(`/admin/coupons/${coupon.id}`).set(bearer(adminToken()))).body.rateLimitPerSecond;
    await page.goto(`${t.url}/console/campaigns/${coupon.id}`);
    const shown = page.locator('.ant-descriptions-row', { hasText: 'Grab rate limit (per second)' });
    await shown.getByText('The service default (RATE_LIMIT_PER_SECOND)').waitFor();
    await page.getByRole('button', { name: 'Rate limit', exact: true }).click();
    const field = page.getByLabel('Grabs per second');
    for (const typed of ['0', '2.5', '1000001']) {
      await field.fill(typed);
      await page.getByTestId('rate-submit').click();
      await page.getByText('A whole number from 1 to 1,000,000, or empty').waitFor();
    }
    expect(await stored()).toBeNull();
    await field.fill('2500');
    await page.getByTestId('rate-submit').click();
    await page.getByText('is now 2,500 per second').waitFor();
    await shown.getByText('2,500', { exact: true }).waitFor();
    expect(await stored()).toBe(2500);
    await page.getByRole('button', { name: 'Rate limit', exact: true }).click();
    expect(
      await eventually(
        () => field.inputValue(),
        (v) => v === '2500',
      ),
    ).toBe('2500');
    await field.fill('');
    await page.getByTestId('rate-submit').click();
    await shown.getByText('The service default (RATE_LIMIT_PER_SECOND)').waitFor();
    expect(await stored()).toBeNull();
  });

  it('writes counts with thousands separators', async () => {
    const big = await createCoupon(t.url, { name: 'Big stock', totalStock: 1_234_567 });
    await page.goto(`${t.url}/console/campaigns/${big.id}`);
    await page.getByTestId('stock-bar').getByText('1,234,567 / 1,234,567').waitFor();
    await page.getByRole('button', { name: 'Stock', exact: true }).click();
    expect(
      await eventually(
        () => page.getByTestId('stock-remaining').textContent(),
        (v) => v?.includes('1,234,567 of 1,234,567') ?? false,
      ),
    ).toContain('1,234,567 of 1,234,567 left');
    await page.keyboard.press('Escape');
  });

  it('names its controls for screen readers: the user search, the run mode, the campaign filter, each webhook switch', async () => {
    await page.getByRole('menuitem', { name: 'User coupons' }).click();
    await page.getByLabel('User id').first().waitFor();
    await page.getByRole('menuitem', { name: 'Reconciliation' }).click();
    await page.getByRole('combobox', { name: 'Mode' }).waitFor();
    await page.getByRole('menuitem', { name: 'Bulk issuance' }).click();
    await page.getByRole('combobox', { name: 'Campaigns' }).waitFor();
    await page.getByRole('menuitem', { name: 'Webhooks' }).click();
    await page
      .getByRole('switch', { name: /^Enabled: http/ })
      .first()
      .waitFor();
  });

  it('makes each control that opens a page one tab stop, never a button inside a link', async () => {
    // A button inside an <a> is invalid HTML and two tab stops, the link's and the button's, for one action.
    const nested = () => page.locator('a button, a [role="button"], button a').count();
    await page.getByRole('menuitem', { name: 'Campaigns' }).click();
    const row = page.locator('.ant-table-row', { has: page.getByTestId(`campaign-${couponId}`) });
    await row.getByRole('button', { name: 'Live' }).waitFor();
    expect(await nested()).toBe(0);
    // One tab stop each: a step back from the Live button is the campaign's name, not a link around the button.
    const live = row.getByRole('button', { name: 'Live' });
    await live.focus();
    await page.keyboard.press('Shift+Tab');
    expect(await focused()).toBe(`campaign-${couponId}`);
    await page.keyboard.press('Tab');
    expect(await focused()).toBe('Live');
    await page.keyboard.press('Enter');
    await page.getByTestId('live-title').waitFor();
    // The campaign's own buttons come with its detail, which a loaded machine answers after the title shows.
    await page.getByRole('button', { name: 'Rate limit' }).waitFor();
    await page.getByRole('button', { name: 'Bulk issue' }).focus();
    expect(await nested()).toBe(0);
    await page.keyboard.press('Shift+Tab');
    expect(await focused()).toBe('Rate limit');
    await page.getByRole('button', { name: 'Back' }).focus();
    await page.keyboard.press('Enter');
    await page.getByTestId(`campaign-${couponId}`).waitFor();
    const [run] = (await request(t.url).get('/admin/reconciliation/runs?limit=1').set(bearer(adminToken()))).body.items as { id: string }[];
    await page.goto(`${t.url}/console/reconciliation/${run.id}`);
    await page.getByRole('button', { name: 'Back' }).waitFor();
    expect(await nested()).toBe(0);
  });

  it('fits a window 800 pixels wide: the menu behind a button, wide tables scrolling inside their cards', async () => {
    const tab = await newTab();
    watchErrors(tab);
    try {
      await tab.setViewportSize({ width: 800, height: 900 });
      await tab.goto(`${t.url}/console/campaigns#token=${adminToken()}`);
      await tab.getByTestId(`campaign-${couponId}`).waitFor();
      await tab.waitForTimeout(400);
      await tab.screenshot({ path: `${SHOTS}/15-campaigns-800px.png` });
      // The page itself never scrolls sideways, and the campaign's name keeps room to be read.
      expect(await tab.evaluate<number>('document.documentElement.scrollWidth')).toBeLessThanOrEqual(800);
      expect((await tab.getByRole('columnheader', { name: 'Name' }).boundingBox())?.width).toBeGreaterThanOrEqual(120);
      // The row's actions stay in view while the table scrolls.
      const [live, card] = await Promise.all([
        tab.getByRole('button', { name: 'Live' }).first().boundingBox(),
        tab.locator('.ant-table-container').boundingBox(),
      ]);
      expect(live && card && live.x + live.width <= card.x + card.width).toBe(true);
      const sider = tab.locator('.ant-layout-sider');
      expect((await sider.boundingBox())?.width).toBe(0);
      const toggle = tab.getByTestId('menu-toggle');
      await toggle.click();
      await tab.getByRole('menuitem', { name: 'Webhooks' }).click();
      await tab.getByRole('button', { name: 'New webhook' }).waitFor();
      expect(await toggle.getAttribute('aria-expanded')).toBe('false');
      // Read after its folding animation (0.2 s), which a loaded machine was once still in (3.6 pixels).
      expect(
        await eventually(
          async () => (await sider.boundingBox())?.width,
          (w) => w === 0,
        ),
      ).toBe(0);
      expect(await tab.evaluate<number>('document.documentElement.scrollWidth')).toBeLessThanOrEqual(800);
    } finally {
      await tab.context().close();
    }
  });

  it('at 1280 pixels shows a campaign’s whole name and grab window, wrapped, and a user coupon’s actions however the table scrolls', async () => {
    // Names that differ only at their end: cut short, "满100减50" read as "满10".
    const name = '双十一全场满300减50优惠券（限时抢购，每人限领两张，先到先得）Campaign 199 满100减50';
    const coupon = await createCoupon(t.url, { name });
    const tab = await newTab();
    watchErrors(tab);
    try {
      await tab.setViewportSize({ width: 1280, height: 800 });
      await tab.goto(`${t.url}/console/campaigns#token=${adminToken()}`);
      const link = tab.getByTestId(`campaign-${coupon.id}`);
      await link.waitFor();
      await tab.waitForTimeout(400);
      await tab.screenshot({ path: `${SHOTS}/16-campaigns-1280px.png` });
      // Every line of the cell (the name, and the window up to its end's zone) lies inside it.
      const fits = await tab.evaluate<{ lines: boolean; inside: boolean; text: string }>(`(() => {
        const td = document.querySelector('[data-testid="campaign-${coupon.id}"]').closest('td');
        const box = td.getBoundingClientRect();
        const lines = [...td.querySelectorAll('a, span')].flatMap((e) => [...e.getClientRects()]);
        return { lines: lines.length > 1, inside: lines.every((r) => r.left >= box.left - 0.5 && r.right <= box.right + 0.5), text: td.innerText };
      })()`);
      expect(fits).toEqual({ lines: true, inside: true, text: expect.stringContaining(name) });
      expect(fits.text).toMatch(/→\s*\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC[+-]\d{2}:\d{2}$/);
      // A user's coupons: the table scrolls sideways, its actions stay in view, and the campaign is a link to its page.
      const uc = await grabUserCoupon(t.url, coupon.id, 'wide-window');
      await tab.goto(`${t.url}/console/users?userId=wide-window`);
      const voidButton = tab.getByTestId(`void-${uc.id}`);
      await voidButton.waitFor();
      const [button, table] = await Promise.all([voidButton.boundingBox(), tab.locator('.ant-table-container').boundingBox()]);
      expect(button && table && button.x >= table.x && button.x + button.width <= table.x + table.width).toBe(true);
      await tab.screenshot({ path: `${SHOTS}/16-user-coupons-1280px.png` });
      await tab.getByRole('link', { name: `#${coupon.id}` }).click();
      await tab.getByText(name).first().waitFor();
      expect(new URL(tab.url()).pathname).toBe(`/console/campaigns/${coupon.id}`);
    } finally {
      await tab.context().close();
    }
  });

  it('keeps the live chart in its card when the menu opens as the chart is first drawn', async () => {
    const tab = await newTab();
    watchErrors(tab);
    try {
      await tab.setViewportSize({ width: 800, height: 900 });
      await tab.goto(`${t.url}/console/campaigns#token=${adminToken()}`);
      await tab.getByTestId(`campaign-${couponId}`).waitFor();
      // The menu opens (its 0.2 s unfolding) the moment the chart's canvas appears:
      // the chart is still being created then, as it is whenever the page's layout moves under it
      // while it loads.
      await tab.evaluate(`new MutationObserver((_, observer) => {
        if (!document.querySelector('[data-testid="live-chart"] canvas')) return;
        observer.disconnect();
        document.querySelector('[data-testid="menu-toggle"]').click();
      }).observe(document.body, { childList: true, subtree: true })`);
      await tab.getByTestId(`campaign-${couponId}`).click();
      await tab.getByTestId('live-chart').locator('canvas').first().waitFor();
      expect(await tab.getByTestId('menu-toggle').getAttribute('aria-expanded')).toBe('true');
      const placed = await eventually(
        () => chartPlacement(tab),
        (p) => p.inside,
        2000,
      );
      expect(placed).toEqual({ ...placed, inside: true });
    } finally {
      await tab.context().close();
    }
  });

  it('fits a phone, 375 by 812: no page scrolls sideways, and each page’s buttons are on the screen', async () => {
    // The most stock a campaign may have: the live page's widest numbers.
    const coupon = await createCoupon(t.url, {
      name: 'On a phone: spend ¥100 save ¥10, a name long enough to wrap',
      totalStock: 1_000_000_000,
    });
    const job = await request(t.url)
      .post(`/admin/coupons/${coupon.id}/issuances`)
      .set(bearer(adminToken()))
      .set('Idempotency-Key', `phone-${coupon.id}`)
      .send({ userIds: ['phone-1'], reason: 'Phone layout', fromStock: true });
    expect(job.status).toBe(202);
    const started = await request(t.url).post('/admin/reconciliation/runs').set(bearer(adminToken()));
    expect(started.status).toBe(202);
    expect(await grab('phone-fan', 'phone-fan-1', coupon.id)).toBe(201);
    const tab = await newTab();
    watchErrors(tab);
    const width = 375;
    const height = 812;
    try {
      await tab.setViewportSize({ width, height });
      const header = () => [tab.getByTestId('menu-toggle'), tab.getByTestId('language'), tab.getByRole('button', { name: 'Sign out' })];
      const screens: { name: string; path: string; buttons: () => Locator[] }[] = [
        {
          name: 'campaigns',
          path: `campaigns#token=${adminToken()}`,
          buttons: () => [tab.getByTestId('new-campaign'), tab.getByRole('button', { name: 'Refresh' })],
        },
        {
          name: 'campaign-live',
          path: `campaigns/${coupon.id}`,
          buttons: () => [
            tab.getByRole('button', { name: 'Back' }),
            tab.getByRole('button', { name: 'Pause' }),
            tab.getByRole('button', { name: 'Stock', exact: true }),
            tab.getByRole('button', { name: 'Rate limit', exact: true }),
            tab.getByRole('button', { name: 'Bulk issue' }),
            tab.getByTestId('live-window'),
            tab.getByTestId('counts-refresh'),
          ],
        },
        {
          name: 'bulk',
          path: 'bulk',
          buttons: () => [
            tab.getByTestId('new-job'),
            tab.getByRole('combobox', { name: 'Campaigns' }),
            tab.getByTestId(`job-${job.body.jobId}`),
          ],
        },
        {
          name: 'runs',
          path: 'reconciliation',
          buttons: () => [tab.getByTestId('start-run'), tab.getByRole('combobox', { name: 'Mode' })],
        },
        { name: 'run', path: `reconciliation/${started.body.runId}`, buttons: () => [tab.getByRole('button', { name: 'Back' })] },
        { name: 'compensations', path: 'compensations', buttons: () => [tab.getByRole('main').locator('.ant-segmented')] },
        { name: 'users', path: 'users?userId=phone-fan', buttons: () => [tab.getByTestId('user-search')] },
        { name: 'webhooks', path: 'webhooks', buttons: () => [tab.getByTestId('new-webhook')] },
      ];
      for (const { name, path, buttons } of screens) {
        await tab.goto(`${t.url}/console/${path}`);
        for (const b of [...header(), ...buttons()]) await b.waitFor();
        await tab.waitForTimeout(400);
        await tab.screenshot({ path: `${SHOTS}/16-phone-${name}.png`, fullPage: true });
        const scrollWidth = await tab.evaluate<number>('document.documentElement.scrollWidth');
        expect([name, scrollWidth <= width ? 'fits' : scrollWidth]).toEqual([name, 'fits']);
        // Within the width seen (the viewport less a scrollbar, if the page has one); further down is a scroll away, as on any phone.
        const seen = await tab.evaluate<number>('document.documentElement.clientWidth');
        // Each card's title whole: beside its controls, a page's title was cut to "Compen…".
        const cutTitles = await tab.evaluate<string[]>(
          `[...document.querySelectorAll('.ant-card-head-title')].filter((e) => e.scrollWidth > e.clientWidth).map((e) => e.textContent)`,
        );
        expect([name, cutTitles]).toEqual([name, []]);
        for (const b of [...header(), ...buttons()]) {
          const box = await b.boundingBox();
          const inside = box !== null && box.x >= 0 && box.x + box.width <= seen;
          expect([name, b.toString(), box, inside]).toEqual([name, b.toString(), box, true]);
        }
        if (name === 'campaign-live') {
          await tab.getByTestId('live-chart').locator('canvas').first().waitFor();
          const placed = await eventually(
            () => chartPlacement(tab),
            (p) => p.newestBarPixels > 0,
          );
          expect(placed).toEqual({ ...placed, inside: true, newestBarPixels: expect.any(Number) });
          expect(placed.newestBarPixels).toBeGreaterThan(0);
        }
      }
      // A user's coupons: the first columns are seen, not lying under a pinned Actions column.
      await tab.goto(`${t.url}/console/users?userId=phone-fan`);
      const firstRow = tab.locator('.ant-table-tbody tr.ant-table-row').first();
      await firstRow.waitFor();
      const uncovered = await tab.evaluate<
        boolean[]
      >(`[...document.querySelector('.ant-table-tbody tr.ant-table-row').querySelectorAll('td')]
        .slice(0, 3)
        .map((td) => {
          const r = td.getBoundingClientRect();
          return td.contains(document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2));
        })`);
      expect(uncovered).toEqual([true, true, true]);
      // The new-campaign form: a date and time to the second fits its field (in half the width its seconds were cut).
      await tab.goto(`${t.url}/console/campaigns`);
      await tab.getByTestId('new-campaign').click();
      const grabStart = tab.locator('input#grabStartAt');
      await grabStart.waitFor();
      await tab.waitForTimeout(400);
      const fits = `(() => { const i = document.querySelector('input#grabStartAt'); return [i.value.length, i.scrollWidth <= i.clientWidth]; })()`;
      expect(await tab.evaluate<[number, boolean]>(fits)).toEqual([19, true]);
      await tab.keyboard.press('Escape');
      // The menu opens over the page, not beside it: the page stays the screen's width. Its mask closes it.
      await tab.getByTestId('menu-toggle').click();
      await tab.getByRole('menuitem', { name: 'Webhooks' }).waitFor();
      await tab.waitForTimeout(400);
      await tab.screenshot({ path: `${SHOTS}/16-phone-menu.png` });
      expect(await tab.evaluate<number>('document.documentElement.scrollWidth')).toBeLessThanOrEqual(width);
      const menu = await tab.locator('.ant-layout-sider').boundingBox();
      expect(menu && menu.x >= 0 && menu.x + menu.width <= width).toBe(true);
      await tab.getByTestId('menu-mask').click({ position: { x: width - 20, y: height / 2 } });
      expect(await tab.getByTestId('menu-toggle').getAttribute('aria-expanded')).toBe('false');
      // A bulk job's drawer too: all of it on the screen, closed from its own button.
      await tab.goto(`${t.url}/console/bulk`);
      await tab.getByTestId(`job-${job.body.jobId}`).click();
      await tab.getByTestId('job-detail').waitFor();
      await tab.waitForTimeout(400);
      await tab.screenshot({ path: `${SHOTS}/16-phone-bulk-job.png` });
      const drawer = await tab.locator('.ant-drawer-open .ant-drawer-section').boundingBox();
      expect(drawer && drawer.x >= 0 && drawer.x + drawer.width <= width).toBe(true);
      expect(await tab.locator('.ant-drawer-open .ant-drawer-body').evaluate((e) => e.scrollWidth <= e.clientWidth)).toBe(true);
      await tab.locator('.ant-drawer-open .ant-drawer-close').click();
      await tab.locator('.ant-drawer-open').waitFor({ state: 'detached' });
    } finally {
      await tab.context().close();
    }
  });

  it('speaks Chinese after the switch', async () => {
    // A toast of the tests before, in English, would otherwise sit in the screenshots.
    await noToasts();
    await page.getByRole('menuitem', { name: 'Campaigns' }).click();
    await page.getByTestId('language').getByText('中文').click();
    await page.getByRole('menuitem', { name: '活动' }).waitFor();
    await page.getByText('新建活动').waitFor();
    await shot('09-campaigns-zh');
    await page.getByRole('menuitem', { name: '批量发券' }).click();
    await page.getByText('批量发券任务').waitFor();
    await page.getByTestId('jobs').locator('.ant-tag', { hasText: '已取消' }).waitFor();
    await shot('14-bulk-jobs-zh');
    // The reconciliation's explanation of the stock it restored, said from its key and values.
    await page.goto(`${t.url}/console/compensations?status=DONE`);
    await page.getByText('库存少了 2 张，但没有对应发出的券：建议补回库存。').waitFor();
    expect(await page.getByText('left the stock').count()).toBe(0);
    // What a rejection did, in words too: nothing.
    await page.goto(`${t.url}/console/compensations?status=REJECTED`);
    await page.locator('.ant-table-row').first().click();
    await page.getByText('无：已拒绝').first().waitFor();
    expect(await page.getByText('nothing: rejected').count()).toBe(0);
    // A webhook's disabled reason as the relay writes it, and a refused URL, in Chinese too.
    const [{ id: hookId }] = (await t.db.query('SELECT MIN(id) AS id FROM webhook_endpoint')) as { id: string }[];
    const disabledBy = '5 deliveries in a row failed every retry (last: HTTP 500)';
    await t.db.query(`UPDATE webhook_endpoint SET enabled = 0, disabled_reason = ?, disabled_at = NOW(3) WHERE id = ?`, [
      disabledBy,
      hookId,
    ]);
    try {
      await page.goto(`${t.url}/console/webhooks`);
      await page.getByText('连续 5 次投递在所有重试后仍失败（最后一次：HTTP 500）').waitFor();
      expect(await page.getByText('deliveries in a row').count()).toBe(0);
    } finally {
      await t.db.query(`UPDATE webhook_endpoint SET enabled = 1, disabled_reason = NULL, disabled_at = NULL WHERE id = ?`, [hookId]);
    }
    await refuseWebhookUrl('不能包含用户名或密码');
    // The API's messages under the fields, said in Chinese: no English sentence under a Chinese label.
    await page.goto(`${t.url}/console/campaigns`);
    await page.getByTestId('new-campaign').click();
    await page.getByTestId('field-name').fill('双十二 满100减10');
    await page.getByTestId('field-validity-days').fill('0');
    await page.getByLabel('优惠金额（元）').fill('0');
    await settle();
    await page.getByTestId('create-submit').click();
    await page.getByText('不能小于 1', { exact: true }).waitFor();
    await page.getByText('不能小于 ¥0.01', { exact: true }).waitFor();
    expect(await page.getByText('must not be less than').count()).toBe(0);
    await page.keyboard.press('Escape');
    // A percentage off said as a Chinese shop says it: 15% off is 打 8.5 折, not "15% 折扣" (which reads as 打 1.5 折).
    await page.goto(`${t.url}/console/campaigns/${percentCouponId}`);
    await page.getByText('满 100 元立减 15%（即 8.5 折），最高减 20 元').waitFor();
    // Yes or no in words: "—" read as "not set".
    const valueOf = (name: string) =>
      page.locator(`xpath=//*[contains(@class,"ant-descriptions-item-label")][normalize-space()="${name}"]/following-sibling::*[1]`);
    expect([await valueOf('可与其他优惠券叠加使用').textContent(), await valueOf('退款时退还优惠券').textContent()]).toEqual(['是', '否']);
    await page.goto(`${t.url}/console/compensations?status=DONE`);
    await page.getByTestId('language').getByText('English').click();
    await page.getByText('2 unit(s) left the stock without an issued coupon: put them back.').waitFor();
    // A list the API refused to read says so, rather than "nothing here" with nothing pending to see.
    await page.goto(`${t.url}/console/compensations?status=bogus`);
    await page.locator('.ant-alert-error').waitFor();
  });

  it('offers campaigns past the newest 100 in the bulk job’s picker', async () => {
    for (let i = 0; i < 100; i += 20) {
      await Promise.all(Array.from({ length: 20 }, (_, j) => createCoupon(t.url, { name: `Filler ${i + j}` })));
    }
    await page.getByRole('menuitem', { name: 'Bulk issuance' }).click();
    await page.getByTestId('new-job').click();
    await page.locator('.ant-modal').waitFor();
    await settle();
    // The first campaign is now the 103rd newest: not among the first page's options.
    await page.locator('.ant-modal .ant-select input').fill('Double 11');
    const first = page.locator('.ant-select-item-option', { hasText: 'Double 11' });
    await page.getByText('The first 100 shown; there are more').waitFor();
    expect(await first.count()).toBe(0);
    // Pressed once, when not loading: a loading button takes no click, and a button pressed in a loop
    // can vanish under the next press (no more pages), which then waits for it until the timeout.
    await page.locator('[data-testid="load-more"]:not(.ant-btn-loading)').click();
    await first.click();
    await page.locator('.ant-modal .ant-select', { hasText: `#${couponId} Double 11` }).waitFor();
    await page.keyboard.press('Escape');
  });

  it('finds campaigns by a part of their name, past the newest page, and says when none matches', async () => {
    // Loaded afresh: the picker's dialog of the test before may still be closing.
    await page.goto(`${t.url}/console/campaigns`);
    const search = page.getByLabel('Search by name or id');
    const names = () => page.locator('.ant-table-row [data-testid^="campaign-"]').allTextContents();
    // The first campaign is over a hundred campaigns down the list by now.
    await search.fill('double 11');
    await search.press('Enter');
    await eventually(names, (n) => n.length > 0 && n.every((name) => /double 11/i.test(name)));
    await page.getByTestId(`campaign-${couponId}`).waitFor();
    await search.fill('Filler 7');
    await search.press('Enter');
    await eventually(names, (n) => n.length > 0 && n.every((name) => name.startsWith('Filler 7')));
    await search.fill('no such campaign');
    await search.press('Enter');
    await page.getByText('No campaign has this in its name or id').waitFor();
    // Cleared, the list is every campaign again.
    await search.fill('');
    await search.press('Enter');
    await eventually(names, (n) => n.length === 20);
  });

  it('gives the focus back to the button that opened a dialog when it closes, by Escape or Cancel', async () => {
    const coupon = await createCoupon(t.url, { name: 'Focus' });
    const uc = await grabUserCoupon(t.url, coupon.id, 'focus-user');
    // A discrepancy, for a compensation to decide.
    await t.db.query('UPDATE coupon_stock SET stock = stock - 1 WHERE coupon_id = ?', [coupon.id]);
    const started = await request(t.url).post('/admin/reconciliation/runs').set(bearer(adminToken()));
    const run = async () => (await request(t.url).get(`/admin/reconciliation/runs/${started.body.runId}`).set(bearer(adminToken()))).body;
    expect((await eventually(run, (r) => r.status !== 'RUNNING', 20_000)).status).toBe('COMPLETED');
    const compensations = (await request(t.url).get(`/admin/compensations?runId=${started.body.runId}`).set(bearer(adminToken()))).body
      .items as { id: string; discrepancy: { couponId: string } }[];
    const compensation = compensations.find((c) => c.discrepancy.couponId === coupon.id)?.id;

    await page.goto(`${t.url}/console/users?userId=focus-user#token=${adminToken()}`);
    await page.getByTestId(`void-${uc.id}`).waitFor();
    for (const close of ['Escape', 'Cancel'] as const) {
      const opener = `void-${uc.id}`;
      expect([opener, close, await focusAfter(page.getByTestId(opener), opener, close)]).toEqual([opener, close, opener]);
    }
    await page.goto(`${t.url}/console/reconciliation/${started.body.runId}`);
    for (const [opener, close] of [
      [`approve-${compensation}`, 'Escape'],
      [`reject-${compensation}`, 'Cancel'],
    ] as const) {
      await page.getByTestId(opener).waitFor();
      expect([opener, close, await focusAfter(page.getByTestId(opener), opener, close)]).toEqual([opener, close, opener]);
    }
    await page.goto(`${t.url}/console/bulk?couponId=${coupon.id}`);
    await page.getByTestId('new-job').waitFor();
    expect(await focusAfter(page.getByTestId('new-job'), 'new-job', 'Escape')).toBe('new-job');
    await page.goto(`${t.url}/console/campaigns/${coupon.id}`);
    for (const [opener, close] of [
      ['Stock', 'Escape'],
      ['Rate limit', 'Cancel'],
    ] as const) {
      const button = page.getByRole('button', { name: opener, exact: true });
      await button.waitFor();
      expect([opener, close, await focusAfter(button, opener, close)]).toEqual([opener, close, opener]);
    }
    // Left as it was: the stock put back, the compensation no longer pending.
    await t.db.query('UPDATE coupon_stock SET stock = stock + 1 WHERE coupon_id = ?', [coupon.id]);
    await request(t.url).post(`/admin/compensations/${compensation}/reject`).set(bearer(adminToken())).send({ reason: 'Test data' });
  });

  it('gives the focus back to the button that opened a drawer when it closes, by Escape or its close button', async () => {
    const coupon = await createCoupon(t.url, { name: 'Drawer focus' });
    const uc = await grabUserCoupon(t.url, coupon.id, 'drawer-focus-user');
    const webhook = await request(t.url).post('/admin/webhooks').set(bearer(adminToken())).send({ url: receiver.url });
    expect(webhook.status).toBe(201);
    const job = await request(t.url)
      .post(`/admin/coupons/${coupon.id}/issuances`)
      .set(bearer(adminToken()))
      .set('Idempotency-Key', `drawer-focus-${coupon.id}`)
      .send({ userIds: ['drawer-focus-1'], reason: 'Drawer focus', fromStock: true });
    expect(job.status).toBe(202);
    const drawers: [string, string, string][] = [
      [`users?userId=drawer-focus-user#token=${adminToken()}`, `history-${uc.id}`, 'history'],
      ['webhooks', `deliveries-${webhook.body.id}`, 'deliveries'],
      [`bulk?couponId=${coupon.id}`, `job-${job.body.jobId}`, 'job'],
      ['campaigns', 'new-campaign', 'create'],
    ];
    for (const [path, opener] of drawers) {
      await page.goto(`${t.url}/console/${path}`);
      await page.getByTestId(opener).waitFor();
      for (const close of ['Escape', 'Close'] as const) {
        expect([opener, close, await focusAfterDrawer(page.getByTestId(opener), opener, close)]).toEqual([opener, close, opener]);
      }
    }
  });

  it('shows what reconciliation wrote in words: yes and no, a dash for none, statuses by name, a repair step by step', async () => {
    const coupon = await createCoupon(t.url, { name: 'Used by hand' });
    const uc = await grabUserCoupon(t.url, coupon.id, 'words-user');
    // Marked used by hand: no redemption, no state-log row. The run proposes putting it back to UNUSED.
    await t.db.query(`UPDATE user_coupon SET status = 'USED', used_at = NOW(3) WHERE id = ?`, [uc.id]);
    const started = await request(t.url).post('/admin/reconciliation/runs').set(bearer(adminToken()));
    expect(started.status).toBe(202);
    const run = async () => (await request(t.url).get(`/admin/reconciliation/runs/${started.body.runId}`).set(bearer(adminToken()))).body;
    expect((await eventually(run, (r) => r.status !== 'RUNNING', 20_000)).status).toBe('COMPLETED');
    const proposed = (
      (await request(t.url).get(`/admin/compensations?runId=${started.body.runId}`).set(bearer(adminToken()))).body.items as {
        id: string;
        discrepancy: { userCouponId: string | null; details: { replayLegal: boolean; usedRedemptionIds: string[] } };
      }[]
    ).find((c) => c.discrepancy.userCouponId === uc.id);
    expect(proposed?.discrepancy.details).toMatchObject({ replayLegal: true, usedRedemptionIds: [] });
    const approved = await request(t.url)
      .post(`/admin/compensations/${proposed?.id}/approve`)
      .set(bearer(adminToken()))
      .send({ reason: 'Nobody used it' });
    expect(approved.status).toBe(200);
    await page.goto(`${t.url}/console/compensations?status=DONE#token=${adminToken()}`);
    await page.locator('.ant-table-row', { hasText: `User coupon #${uc.id}` }).click();
    const expanded = page.locator('.ant-table-expanded-row', { hasText: 'What was done' });
    await expanded.waitFor();
    await shot('08b-compensation-in-words');
    // A bordered description is a table: a label cell and a content cell per row.
    const item = (name: string) =>
      expanded
        .locator('tr.ant-descriptions-row', { has: page.locator('th.ant-descriptions-item-label', { hasText: new RegExp(`^${name}$`) }) })
        .first()
        .locator('td.ant-descriptions-item-content')
        .first();
    expect(await item('Log replays legally').textContent()).toBe('Yes');
    expect(await item('Redemptions that used it').textContent()).toBe('—');
    expect(await item('Status').textContent()).toBe('Used');
    expect(await item('Status to repair to').textContent()).toBe('Unused');
    // The steps done, each its own lines rather than JSON.
    expect(
      await item('Steps')
        .locator('.ant-descriptions-item-label', { hasText: /^Step$/ })
        .count(),
    ).toBeGreaterThan(0);
    const leaves = await expanded
      .locator('.ant-descriptions-item-content')
      .evaluateAll((cells) => cells.filter((c) => !c.querySelector('.ant-descriptions')).map((c) => c.textContent ?? ''));
    expect(leaves.filter((v) => ['true', 'false', 'null', '[]', '{}', ''].includes(v) || v.startsWith('[') || v.startsWith('{'))).toEqual(
      [],
    );
  });

  it("says a hold's and a log's repairs in words too: no key as written, times in the zone, a log row's fields left to the approval", async () => {
    const coupon = await createCoupon(t.url, { name: 'Repairs in words' });
    const held = await grabUserCoupon(t.url, coupon.id, 'words-held');
    const hold = await request(t.url)
      .post('/redemptions/holds')
      .set(bearer(serviceToken()))
      .send({ userCouponId: held.id, orderNo: `words-${held.id}`, orderAmountCents: 20_000, userId: 'words-held' });
    expect(hold.status).toBe(201);
    // Its lock no longer ends with its hold (SET_LOCKED_UNTIL), and another coupon lost its log (APPEND_LOG).
    await t.db.query(`UPDATE user_coupon SET locked_until = locked_until + INTERVAL 5 HOUR WHERE id = ?`, [held.id]);
    const unlogged = await grabUserCoupon(t.url, coupon.id, 'words-unlogged');
    await t.db.query(`DELETE FROM user_coupon_state_log WHERE user_coupon_id = ?`, [unlogged.id]);
    const started = await request(t.url).post('/admin/reconciliation/runs').set(bearer(adminToken()));
    expect(started.status).toBe(202);
    const run = async () => (await request(t.url).get(`/admin/reconciliation/runs/${started.body.runId}`).set(bearer(adminToken()))).body;
    expect((await eventually(run, (r) => r.status !== 'RUNNING', 20_000)).status).toBe('COMPLETED');
    await page.goto(`${t.url}/console/compensations?status=PENDING#token=${adminToken()}`);
    const texts: string[] = [];
    const labels: string[] = [];
    const readWords = async (within: Locator) => {
      texts.push((await within.textContent()) ?? '');
      labels.push(...(await within.locator('.ant-descriptions-item-label').allTextContents()));
    };
    for (const uc of [held.id, unlogged.id]) {
      texts.push((await page.locator('.ant-table-row', { hasText: `User coupon #${uc}` }).textContent()) ?? '');
      await page.locator('.ant-table-row', { hasText: `User coupon #${uc}` }).click();
      await readWords(page.locator('.ant-table-expanded-row').filter({ visible: true }).last());
      await page
        .locator('.ant-table-row', { hasText: `User coupon #${uc}` })
        .getByRole('button', { name: /Approve/ })
        .click();
      const dialog = page.locator('.ant-modal').filter({ visible: true });
      await dialog.waitFor();
      await readWords(dialog);
      if (uc === unlogged.id) {
        await shot('08c-approve-log-repair');
        // The log row it appends: its id, reason and time are the approval's, and each word is whole on its line.
        expect(await dialog.getByText('written when approved').count()).toBe(3);
        const unused = dialog.locator('.ant-descriptions-item-content', { hasText: /^Unused$/ }).last();
        expect((await unused.boundingBox())?.height ?? 0).toBeLessThan(40);
      }
      // Once its opening animation is over: a Cancel pressed during it, on a loaded CI machine, left the dialog open.
      await settle();
      await dialog.getByRole('button', { name: 'Cancel' }).click();
      await dialog.waitFor({ state: 'hidden' });
    }
    // Every label in words (no camelCase key as the server wrote it), every time in the operator's zone (no ISO instant).
    expect(labels.length).toBeGreaterThan(10);
    expect(labels.filter((l) => /^[a-z]+[A-Z]\w*$/.test(l) || /^[a-z]+$/.test(l))).toEqual([]);
    expect(texts.filter((x) => /\d{4}-\d{2}-\d{2}T\d{2}:\d{2}/.test(x))).toEqual([]);
    // Findings, actions, a repair's steps and the statuses its explanation names in words: no code as the server wrote it (APPEND_LOG, ACTIVE).
    expect(texts.join(' ').match(/\b[A-Z]{4,}(?:_[A-Z]+)*\b/g)).toBeNull();
    for (const named of ['Log disagrees with status', 'Repair the coupon', 'Append log rows', 'Set the lock’s end'])
      expect(texts.join(' ')).toContain(named);
  });
});
