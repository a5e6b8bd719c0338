import { Injectable } from '@nestjs/common';
import { InjectRepository } from '@nestjs/typeorm';
import pLimit from 'p-limit';
import { EntityManager, FindOptionsWhere, LessThan, Like, MoreThan, Repository } from 'typeorm';
import { AppConfig } from '../config/app-config.js';
import { isDuplicateKey } from '../common/db-errors.js';
import { AppError } from '../common/errors.js';
import { SharedJson } from '../common/shared-json.js';
import { ID_PATTERN, validationFailed } from '../common/validation.js';
import { Page, toPage } from '../common/page.js';
import { readSnapshot, TransactionService } from '../database/transaction.service.js';
import { StockRow, StockService } from '../ledger/stock.service.js';
import { countByStatus, CouponCounts } from '../ledger/user-coupons.js';
import { AdminOperation, findAdminRequest, recordAdminRequest, requestDigest, setAdminRequestCoupon } from './admin-requests.js';
import { Coupon, grabClosesAt } from './coupon.entity.js';
import { discountOf } from './discount.js';
import { FreshCache, Observation } from './fresh-cache.js';
import { CreateCouponDto, PatchCouponDto } from './coupon.dto.js';

/** The public list is one cached value. */
const LIVE = 'live';
/** Reads of coupons with their counts one instance runs at once (CouponService.counting). */
export const COUNTING_READS = 2;

const MIN_INSTANT = Date.parse('2000-01-01T00:00:00Z');
const MAX_INSTANT = Date.parse('9999-01-01T00:00:00Z');

function instant(field: string, value: string): Date {
  const t = Date.parse(value);
  if (!Number.isFinite(t) || t < MIN_INSTANT || t >= MAX_INSTANT)
    throw validationFailed({ [field]: ['must be a date between 2000 and 9998'] });
  return new Date(t);
}

/** The template a creation request makes, its defaults filled in; 400 for fields that do not go together. */
function templateFields(dto: CreateCouponDto) {
  const grabStartAt = instant('grabStartAt', dto.grabStartAt);
  const grabEndAt = instant('grabEndAt', dto.grabEndAt);
  if (grabEndAt <= grabStartAt) throw validationFailed({ grabEndAt: ['must be after grabStartAt'] });
  const v = dto.validity;
  let validityStartAt: Date | null = null;
  let validityEndAt: Date | null = null;
  if (v.type === 'FIXED') {
    if (v.days !== undefined) throw validationFailed({ 'validity.days': ['only for RELATIVE validity'] });
    validityStartAt = instant('validity.startAt', v.startAt as string);
    validityEndAt = instant('validity.endAt', v.endAt as string);
    if (validityEndAt <= validityStartAt) throw validationFailed({ 'validity.endAt': ['must be after validity.startAt'] });
  } else if (v.startAt !== undefined || v.endAt !== undefined) {
    throw validationFailed({ validity: ['startAt and endAt are only for FIXED validity'] });
  }
  const d = dto.discount;
  const percent = d.type === 'PERCENT';
  if (percent && d.amountCents !== undefined) throw validationFailed({ 'discount.amountCents': ['only for AMOUNT discounts'] });
  if (!percent && (d.percentOff !== undefined || d.maxDiscountCents !== undefined)) {
    throw validationFailed({ discount: ['percentOff and maxDiscountCents are only for PERCENT discounts'] });
  }
  return {
    name: dto.name,
    perUserLimit: dto.perUserLimit ?? 1,
    grabStartAt,
    grabEndAt,
    validityType: v.type,
    validityStartAt,
    validityEndAt,
    validityDays: v.type === 'RELATIVE' ? (v.days as number) : null,
    thresholdCents: d.thresholdCents,
    discountType: percent ? ('PERCENT' as const) : ('AMOUNT' as const),
    discountCents: percent ? null : (d.amountCents as number),
    percentOff: percent ? (d.percentOff as number) : null,
    maxDiscountCents: percent ? (d.maxDiscountCents ?? null) : null,
    stackable: dto.stackable ?? false,
    rateLimitPerSecond: dto.rateLimitPerSecond ?? null,
    returnOnRefund: dto.returnOnRefund ?? false,
  };
}

export function toCouponView(c: Coupon, s: StockRow) {
  return {
    id: c.id,
    name: c.name,
    status: c.status,
    perUserLimit: c.perUserLimit,
    grabStartAt: c.grabStartAt.toISOString(),
    grabEndAt: c.grabEndAt.toISOString(),
    validity:
      c.validityType === 'FIXED'
        ? { type: 'FIXED' as const, startAt: c.validityStartAt?.toISOString(), endAt: c.validityEndAt?.toISOString() }
        : { type: 'RELATIVE' as const, days: c.validityDays },
    discount: discountOf(c),
    rateLimitPerSecond: c.rateLimitPerSecond,
    returnOnRefund: c.returnOnRefund,
    stackable: c.stackable,
    initStock: s.initStock,
    remainingStock: s.stock,
  };
}
export type CouponView = ReturnType<typeof toCouponView>;

const sameItems = (a: readonly CouponView[], b: readonly CouponView[]) => a.length === b.length && a.every((v, i) => v === b[i]);

/** A coupon of the public list, with what the list orders and filters by computed once per read. */
interface LiveItem {
  view: CouponView;
  startMs: number;
  endMs: number;
  idNum: number;
}

/** A public answer already serialised, reused while what it was made from is the same objects. */
interface PublicPage {
  coupon: Coupon;
  stock: StockRow;
  json: SharedJson;
}

interface PublicListPage {
  items: CouponView[];
  nextCursor: string | null;
  json: SharedJson;
}

function existing(id: string, coupon: Coupon | null): Coupon {
  if (!coupon) throw new AppError('COUPON_NOT_FOUND', `Coupon ${id} does not exist`);
  return coupon;
}

/**
 * Coupon templates, and the public coupon page and list, served from memory (FreshCache): a
 * template, a stock row and the list are each read again at most about twice per
 * COUPON_CACHE_TTL_MS (from half of it on, in the background), so a crowd reloading the page during
 * a sale costs the database nothing per request. The public answers are never older than
 * COUPON_CACHE_TTL_MS; a grab takes a template up to twice that old while a slow refresh replaces
 * it, never older (an instance whose template of a quiet coupon had aged issued coupons of a coupon
 * paused seconds before through another instance). Changes made through this
 * instance show at once: its grouped grabs publish the stock they leave (they hold the stock row's
 * lock, so it is exact), its other changes drop what they change. Changes made through another
 * instance show within COUPON_CACHE_TTL_MS, to grabs within twice that while the database is slow.
 */
@Injectable()
export class CouponService {
  private readonly ttl = () => this.config.COUPON_CACHE_TTL_MS;
  private readonly templates = new FreshCache<Coupon | null>(this.ttl, (id) => this.coupons.findOneBy({ id }));
  private readonly stocks = new FreshCache<StockRow | null>(this.ttl, (id) => this.stock.find(this.coupons.manager, id));
  private readonly liveList = new FreshCache<LiveItem[]>(this.ttl, () => this.readLive(), 1);
  /**
   * The last answer of GET /coupons/:id per coupon and of GET /coupons per limit and cursor, as JSON:
   * serialising a page of 20 coupons was a fifth of the list's CPU per request in the profile.
   */
  private readonly pages = new Map<string, PublicPage>();
  private readonly listPages = new Map<string, PublicListPage>();
  /** A list item shown with the stock this instance's grabs left, per coupon (withLatestStock). */
  private readonly overlays = new Map<string, { view: CouponView; stock: StockRow; merged: CouponView }>();
  /** Coupons a grab found sold out, until when. Only a hint: the conditional UPDATE stays the authority. */
  private readonly soldOut = new Map<string, number>();
  /**
   * Reads with counts under way at once; the rest wait here, holding no pool connection. Counting
   * reads every user coupon's index entry, 1.5 s for a coupon of 8 million: 22 such reads at once
   * (console tabs, a script) held the whole pool and grabs on other coupons waited seconds for a connection.
   */
  private readonly counting = pLimit(COUNTING_READS);

  constructor(
    @InjectRepository(Coupon) private readonly coupons: Repository<Coupon>,
    private readonly tx: TransactionService,
    private readonly stock: StockService,
    private readonly config: AppConfig,
  ) {}

  /**
   * `write` at most once per Idempotency-Key (none: every call writes). The key is recorded first in
   * the write's transaction, so a repeat, whether sent after the first committed or while it runs,
   * is answered the coupon the first wrote, as it is now (`replayed`), without writing again, even
   * where writing again would now be refused (stock already removed); the same key with another
   * request is 422.
   */
  private async once(
    operation: AdminOperation,
    /** The Idempotency-Key and the digest of the request it came with (requestDigest). */
    keyed: { key: string; digest: string } | undefined,
    /** The coupon the request changes, when it exists before (null: the write creates it). */
    couponId: string | null,
    write: (em: EntityManager, at: Date) => Promise<string>,
  ): Promise<{ couponId: string; replayed: boolean }> {
    if (keyed === undefined) return { couponId: await this.tx.inTransaction((em) => write(em, new Date())), replayed: false };
    const { key, digest } = keyed;
    try {
      const written = await this.tx.inTransaction(async (em) => {
        const now = new Date();
        await recordAdminRequest(em, operation, key, digest, couponId, now);
        const id = await write(em, now);
        if (couponId === null) await setAdminRequestCoupon(em, operation, key, id);
        return id;
      });
      return { couponId: written, replayed: false };
    } catch (err) {
      if (!isDuplicateKey(err)) throw err;
      const earlier = await this.earlier(operation, key, digest);
      if (!earlier) throw err;
      return { couponId: earlier, replayed: true };
    }
  }

  /** The coupon a committed request under this key changed, or null; 422 when that request was another. */
  private async earlier(operation: AdminOperation, key: string, digest: string): Promise<string | null> {
    const earlier = await findAdminRequest(this.coupons.manager, operation, key);
    if (!earlier?.couponId) return null;
    if (earlier.digest !== digest) {
      throw new AppError('IDEMPOTENCY_KEY_REUSED', 'This Idempotency-Key was already used for another request', {
        couponId: earlier.couponId,
      });
    }
    return earlier.couponId;
  }

  async create(dto: CreateCouponDto, key?: string): Promise<{ coupon: CouponView; replayed: boolean }> {
    const fields = templateFields(dto);
    // The digest of the template the request makes, not of its text: a retry that writes an instant
    // otherwise (…00Z for …00.000Z) or spells out a default was refused as another request (422).
    // Before the check below: it depends on the time, and a repeat after it must still be its replay.
    const keyed = key === undefined ? undefined : { key, digest: requestDigest({ ...fields, totalStock: dto.totalStock }) };
    const earlier = keyed && (await this.earlier('coupon.create', keyed.key, keyed.digest));
    if (earlier) return { coupon: await this.view(earlier), replayed: true };
    if (fields.validityEndAt !== null) {
      // Every coupon of it would be issued EXPIRED.
      if (fields.validityEndAt <= new Date()) throw validationFailed({ 'validity.endAt': ['has already passed'] });
      // Grabbing ends with the validity (grabClosesAt): such a coupon could never be grabbed.
      if (fields.validityEndAt <= fields.grabStartAt) throw validationFailed({ 'validity.endAt': ['must be after grabStartAt'] });
    }
    const now = new Date();
    const coupon = Object.assign(new Coupon(), { ...fields, status: 'ACTIVE' as const, createdAt: now, updatedAt: now });
    const { couponId, replayed } = await this.once('coupon.create', keyed, null, async (em) => {
      const c = await em.save(Coupon, Object.assign(new Coupon(), coupon));
      await this.stock.create(em, c.id, dto.totalStock, now);
      return c.id;
    });
    this.invalidate(couponId);
    return { coupon: await this.view(couponId), replayed };
  }

  /** The template for the grab path (see the class comment). Throws COUPON_NOT_FOUND. */
  async template(id: string): Promise<Coupon> {
    return existing(id, (await this.templates.get(id)).value);
  }

  /**
   * The template for a grab without a promise (its common case: every promise a grab creates lives
   * until its group commits): one younger than COUPON_CACHE_TTL_MS, or while a slow refresh is out,
   * up to twice that (FreshCache.held); undefined when the grab must wait for the database.
   */
  heldTemplate(id: string): Coupon | undefined {
    const held = this.templates.held(id);
    return held && existing(id, held.value);
  }

  invalidate(id: string): void {
    this.templates.invalidate(id);
    this.stocks.invalidate(id);
    this.soldOut.delete(id);
    this.liveList.invalidate(LIVE);
  }

  /** What a grouped grab left in stock, read and changed under the stock row's lock and committed. */
  stockAfterGrabs(id: string, stock: StockRow): void {
    this.stocks.set(id, { initStock: stock.initStock, stock: stock.stock });
  }

  /** A grab of this instance took a unit without learning how many are left: the next page reads the stock again. */
  stockChanged(id: string): void {
    this.stocks.invalidate(id);
  }

  /** GET /coupons/:id as JSON: the template and the stock row from memory (class comment). */
  async publicViewJson(id: string): Promise<SharedJson> {
    const held = this.heldPublicViewJson(id);
    if (held) return held;
    const [{ value: coupon }, { value: stock }] = await Promise.all([this.templates.get(id), this.stocks.get(id)]);
    if (!coupon || !stock) throw new AppError('COUPON_NOT_FOUND', `Coupon ${id} does not exist`);
    return this.pageJson(id, coupon, stock);
  }

  /** publicViewJson's answer when memory holds a fresh template and stock row of the coupon, else undefined (nothing awaited). */
  heldPublicViewJson(id: string): SharedJson | undefined {
    const coupon = this.templates.fresh(id)?.value;
    const stock = this.stocks.fresh(id)?.value;
    return coupon && stock ? this.pageJson(id, coupon, stock) : undefined;
  }

  private pageJson(id: string, coupon: Coupon, stock: StockRow): SharedJson {
    const last = this.pages.get(id);
    if (last && last.coupon === coupon && last.stock === stock) return last.json;
    if (this.pages.size >= 10_000) this.pages.clear();
    const json = new SharedJson(JSON.stringify(toCouponView(coupon, stock)));
    this.pages.set(id, { coupon, stock, json });
    return json;
  }

  /**
   * GET /coupons as JSON (livePage), serialised again only when the page shows other objects.
   * Kept per page shown (a run of the ordered list: its first coupon, length and next cursor), not
   * per query: any cursor of the right form is valid, and one made up per request had a page
   * serialised and gzip'd per request.
   */
  async liveCouponsJson(limit: number, cursor?: string): Promise<SharedJson> {
    return this.heldLiveCouponsJson(limit, cursor) ?? this.listJson(this.livePage(await this.liveList.get(LIVE), limit, cursor));
  }

  /** liveCouponsJson's answer when memory holds a fresh list, else undefined (nothing awaited). */
  heldLiveCouponsJson(limit: number, cursor?: string): SharedJson | undefined {
    const snapshot = this.liveList.fresh(LIVE);
    return snapshot && this.listJson(this.livePage(snapshot, limit, cursor));
  }

  private listJson(page: Page<CouponView>): SharedJson {
    const key = `${page.items[0]?.id ?? ''}_${page.items.length}_${page.nextCursor ?? ''}`;
    const last = this.listPages.get(key);
    if (last && sameItems(last.items, page.items)) return last.json;
    if (this.listPages.size >= 1000) this.listPages.clear();
    const json = new SharedJson(JSON.stringify(page));
    this.listPages.set(key, { ...page, json });
    return json;
  }

  /**
   * The public coupon centre: coupons not paused whose grab window has not ended, soonest grab start
   * first (then id), cursor-paginated, from one snapshot of the whole list (class comment). A coupon
   * whose stock this instance knows more recently than the snapshot (its own grabs) shows that stock.
   */
  private livePage(snapshot: Observation<LiveItem[]>, limit: number, cursor?: string): Page<CouponView> {
    const now = Date.now();
    const [startMs, id] = cursor ? cursor.split('_').map(Number) : [-Infinity, 0];
    const items = snapshot.value;
    const page: CouponView[] = [];
    let last: LiveItem | undefined;
    let more = false;
    for (const item of items) {
      if (item.startMs < startMs || (item.startMs === startMs && item.idNum <= id) || item.endMs <= now) continue;
      if (page.length === limit) {
        more = true;
        break;
      }
      page.push(this.withLatestStock(item.view, snapshot.at));
      last = item;
    }
    return { items: page, nextCursor: more && last ? `${last.startMs}_${last.view.id}` : null };
  }

  /** The same object for the same view and stock row, so the serialised list page can be reused. */
  private withLatestStock(view: CouponView, snapshotAt: number): CouponView {
    const st = this.stocks.peek(view.id);
    if (!st?.value || st.at <= snapshotAt) return view;
    const last = this.overlays.get(view.id);
    if (last && last.view === view && last.stock === st.value) return last.merged;
    if (this.overlays.size >= 10_000) this.overlays.clear();
    const merged = { ...view, initStock: st.value.initStock, remainingStock: st.value.stock };
    this.overlays.set(view.id, { view, stock: st.value, merged });
    return merged;
  }

  private async readLive(): Promise<LiveItem[]> {
    const coupons = await this.coupons.find({
      where: { status: 'ACTIVE', grabEndAt: MoreThan(new Date()) },
      order: { grabStartAt: 'ASC', id: 'ASC' },
    });
    const stockOf = await this.stock.findMany(
      this.coupons.manager,
      coupons.map((c) => c.id),
    );
    return coupons.flatMap((c) => {
      const st = stockOf.get(c.id);
      return st
        ? [{ view: toCouponView(c, st), startMs: c.grabStartAt.getTime(), endMs: grabClosesAt(c).getTime(), idNum: Number(c.id) }]
        : [];
    });
  }

  markSoldOut(id: string): void {
    if (this.soldOut.size > 10_000) this.soldOut.clear();
    this.soldOut.set(id, Date.now() + this.config.COUPON_CACHE_TTL_MS);
  }

  isSoldOut(id: string): boolean {
    return (this.soldOut.get(id) ?? 0) > Date.now();
  }

  async view(id: string, em: EntityManager = this.coupons.manager): Promise<CouponView> {
    const coupon = await em.findOneBy(Coupon, { id });
    const stock = coupon && (await this.stock.find(em, id));
    if (!coupon || !stock) throw new AppError('COUPON_NOT_FOUND', `Coupon ${id} does not exist`);
    return toCouponView(coupon, stock);
  }

  /**
   * The coupon with its counts, read in one snapshot: read apart, a grab committed between the
   * stock and the counts broke invariant 1 (remainingStock + issuedFromStock = initStock) in the answer.
   */
  viewWithCounts(id: string): Promise<CouponView & { counts: CouponCounts }> {
    return this.counting(() =>
      readSnapshot(this.coupons.manager.connection, async (em) => {
        const view = await this.view(id, em);
        const counts = await countByStatus(em, [id]);
        return { ...view, counts: counts.get(id)! };
      }),
    );
  }

  /**
   * Newest first, each with its stock and counts, in one snapshot as viewWithCounts; `nextCursor` is
   * the last id of the page. With `q`, those whose name holds it (in the column's collation: any
   * case) or whose id it is.
   */
  list(limit: number, cursor?: string, q?: string): Promise<Page<CouponView & { counts: CouponCounts }>> {
    const before: FindOptionsWhere<Coupon> = cursor ? { id: LessThan(cursor) } : {};
    const where = [q === undefined ? before : { ...before, name: Like(`%${q.replace(/[\\%_]/g, '\\$&')}%`) }];
    // An id typed into the search finds that coupon too.
    if (q !== undefined && ID_PATTERN.test(q) && (!cursor || BigInt(q) < BigInt(cursor))) where.push({ id: q });
    return this.counting(() =>
      readSnapshot(this.coupons.manager.connection, async (em) => {
        const rows = await em.find(Coupon, { where, order: { id: 'DESC' }, take: limit + 1 });
        const { items, nextCursor } = toPage(rows, limit, (c) => c);
        const ids = items.map((c) => c.id);
        const stocks = await this.stock.findMany(em, ids);
        const counts = await countByStatus(em, ids);
        // Coupon and stock row are created in one transaction: a coupon without one is not listed.
        return {
          items: items.flatMap((c) => {
            const stock = stocks.get(c.id);
            return stock ? [{ ...toCouponView(c, stock), counts: counts.get(c.id)! }] : [];
          }),
          nextCursor,
        };
      }),
    );
  }

  /** What a live page polls: the template from the grab path's cache and one primary-key read of the stock row. */
  async live(id: string): Promise<{ status: Coupon['status']; initStock: number; remainingStock: number }> {
    const coupon = await this.template(id);
    const stock = await this.stock.find(this.coupons.manager, id);
    if (!stock) throw new AppError('COUPON_NOT_FOUND', `Coupon ${id} does not exist`);
    return { status: coupon.status, initStock: stock.initStock, remainingStock: stock.stock };
  }

  async patch(id: string, dto: PatchCouponDto): Promise<CouponView> {
    if (dto.status === undefined && dto.rateLimitPerSecond === undefined) {
      throw validationFailed({ body: ['give status and/or rateLimitPerSecond'] });
    }
    const changes: Partial<Coupon> = { updatedAt: new Date() };
    if (dto.status !== undefined) changes.status = dto.status;
    if (dto.rateLimitPerSecond !== undefined) changes.rateLimitPerSecond = dto.rateLimitPerSecond;
    // In a transaction like every write, so a lost answer to it is resolved (or 503 OUTCOME_UNKNOWN), not a 503 that claims nothing changed.
    const res = await this.tx.inTransaction((em) => em.update(Coupon, { id }, changes));
    if (!res.affected) throw new AppError('COUPON_NOT_FOUND', `Coupon ${id} does not exist`);
    this.invalidate(id);
    return this.view(id);
  }

  async adjustStock(id: string, delta: number, key?: string): Promise<{ coupon: CouponView; replayed: boolean }> {
    await this.template(id);
    const keyed = key === undefined ? undefined : { key, digest: requestDigest({ couponId: id, delta }) };
    const { replayed } = await this.once('coupon.stock', keyed, id, async (em, at) => {
      await this.stock.adjust(em, id, delta, at);
      return id;
    });
    this.invalidate(id);
    return { coupon: await this.view(id), replayed };
  }
}
