import { Injectable } from '@nestjs/common';
import { InjectRepository } from '@nestjs/typeorm';
import { LessThan, MoreThan, Repository } from 'typeorm';
import { AppConfig } from '../config/app-config.js';
import { AppError } from '../common/errors.js';
import { validationFailed } from '../common/validation.js';
import { Page, toPage } from '../common/page.js';
import { TransactionService } from '../database/transaction.service.js';
import { StockRow, StockService } from '../ledger/stock.service.js';
import { countByStatus } from '../ledger/user-coupons.js';
import { Coupon } from './coupon.entity.js';
import { discountOf } from './discount.js';
import { CreateCouponDto, PatchCouponDto } from './coupon.dto.js';

const MIN_INSTANT = Date.parse('2000-01-01T00:00:00Z');
const MAX_INSTANT = Date.parse('9999-01-01T00:00:00Z');

function instant(field: string, value: string): Date {
  const t = Date.parse(value);
  if (!Number.isFinite(t) || t < MIN_INSTANT || t >= MAX_INSTANT)
    throw validationFailed({ [field]: ['must be a date between 2000 and 9998'] });
  return new Date(t);
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

interface LiveSnapshot {
  items?: CouponView[];
  until: number;
  loading?: Promise<CouponView[]>;
}

interface CacheEntry {
  coupon: Coupon | null;
  until: number;
  /** The one database read under way for this id, shared by every grab that needs it meanwhile. */
  loading?: Promise<Coupon | null>;
}

/**
 * Coupon templates. The grab path reads templates from a short-lived in-memory cache so the rate
 * limiter and the window checks cost no database round trip; changes made through this instance
 * invalidate it at once, changes made through another instance show within COUPON_CACHE_TTL_MS.
 */
@Injectable()
export class CouponService {
  private readonly cache = new Map<string, CacheEntry>();
  /** Coupons a grab found sold out, until when. Only a hint: the conditional UPDATE stays the authority. */
  private readonly soldOut = new Map<string, number>();
  private liveSnapshot?: LiveSnapshot;

  constructor(
    @InjectRepository(Coupon) private readonly coupons: Repository<Coupon>,
    private readonly tx: TransactionService,
    private readonly stock: StockService,
    private readonly config: AppConfig,
  ) {}

  async create(dto: CreateCouponDto): Promise<CouponView> {
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
    const now = new Date();
    const coupon = Object.assign(new Coupon(), {
      name: dto.name,
      status: 'ACTIVE' as const,
      perUserLimit: dto.perUserLimit ?? 1,
      grabStartAt,
      grabEndAt,
      validityType: v.type,
      validityStartAt,
      validityEndAt,
      validityDays: v.type === 'RELATIVE' ? (v.days as number) : null,
      thresholdCents: dto.discount.thresholdCents,
      discountType: percent ? ('PERCENT' as const) : ('AMOUNT' as const),
      discountCents: percent ? null : (d.amountCents as number),
      percentOff: percent ? (d.percentOff as number) : null,
      maxDiscountCents: percent ? (d.maxDiscountCents ?? null) : null,
      stackable: dto.stackable ?? false,
      rateLimitPerSecond: dto.rateLimitPerSecond ?? null,
      returnOnRefund: dto.returnOnRefund ?? false,
      createdAt: now,
      updatedAt: now,
    });
    const saved = await this.tx.inTransaction(async (em) => {
      const c = await em.save(Coupon, Object.assign(new Coupon(), coupon));
      await this.stock.create(em, c.id, dto.totalStock, now);
      return c;
    });
    this.invalidate(saved.id);
    return toCouponView(saved, { initStock: dto.totalStock, stock: dto.totalStock });
  }

  /**
   * The template for the grab path: from memory when fresh. An expired entry is refreshed by one
   * read while the burst keeps being served the previous version, so a flash sale never sends a
   * wave of template reads to the database. Throws COUPON_NOT_FOUND.
   */
  async template(id: string): Promise<Coupon> {
    let entry = this.cache.get(id);
    if (!entry || entry.until <= Date.now()) {
      if (!entry?.loading) entry = this.load(id);
      const stale = this.config.COUPON_CACHE_TTL_MS > 0 ? entry.coupon : null;
      entry = { ...entry, coupon: stale ?? ((await entry.loading) as Coupon | null) };
    }
    if (!entry.coupon) throw new AppError('COUPON_NOT_FOUND', `Coupon ${id} does not exist`);
    return entry.coupon;
  }

  private load(id: string): CacheEntry {
    const previous = this.cache.get(id);
    const loading = this.coupons.findOneBy({ id });
    const entry: CacheEntry = { coupon: previous?.coupon ?? null, until: previous?.until ?? 0, loading };
    if (this.cache.size > 10_000) this.cache.clear();
    this.cache.set(id, entry);
    loading.then(
      (coupon) => {
        if (this.cache.get(id) === entry) this.cache.set(id, { coupon, until: Date.now() + this.config.COUPON_CACHE_TTL_MS });
      },
      () => {
        if (this.cache.get(id) === entry) this.cache.delete(id);
      },
    );
    return entry;
  }

  invalidate(id: string): void {
    this.cache.delete(id);
    this.soldOut.delete(id);
    this.liveSnapshot = undefined;
  }

  /**
   * The public coupon centre: coupons not paused whose grab window has not ended, soonest grab start
   * first (then id), cursor-paginated. Served from one in-memory snapshot of the whole list, read
   * again at most every COUPON_CACHE_TTL_MS by one query (the previous snapshot is served meanwhile),
   * so a crowd refreshing the page costs the database nothing per request. Changes made through
   * this instance show at once, through others within COUPON_CACHE_TTL_MS.
   */
  async liveCoupons(limit: number, cursor?: string): Promise<{ items: CouponView[]; nextCursor: string | null }> {
    const now = Date.now();
    if (!this.liveSnapshot || (this.liveSnapshot.until <= now && !this.liveSnapshot.loading))
      this.liveSnapshot = this.loadLive(this.liveSnapshot);
    const snapshot = this.liveSnapshot.items ?? (await this.liveSnapshot.loading);
    const [startMs, id] = cursor ? cursor.split('_').map(Number) : [-Infinity, 0];
    const open = (snapshot ?? []).filter((c) => Date.parse(c.grabEndAt) > now);
    const from = open.findIndex((c) => Date.parse(c.grabStartAt) > startMs || (Date.parse(c.grabStartAt) === startMs && Number(c.id) > id));
    const page = from < 0 ? [] : open.slice(from, from + limit);
    const last = page.at(-1);
    return { items: page, nextCursor: last && from + limit < open.length ? `${Date.parse(last.grabStartAt)}_${last.id}` : null };
  }

  private loadLive(previous?: LiveSnapshot): LiveSnapshot {
    const entry: LiveSnapshot = { items: previous?.items, until: previous?.until ?? 0 };
    entry.loading = this.coupons
      .find({ where: { status: 'ACTIVE', grabEndAt: MoreThan(new Date()) }, order: { grabStartAt: 'ASC', id: 'ASC' } })
      .then(async (coupons) => {
        const stockOf = await this.stock.findMany(
          this.coupons.manager,
          coupons.map((c) => c.id),
        );
        const items = coupons.flatMap((c) => {
          const st = stockOf.get(c.id);
          return st ? [toCouponView(c, st)] : [];
        });
        if (this.liveSnapshot === entry)
          Object.assign(entry, { items, until: Date.now() + this.config.COUPON_CACHE_TTL_MS, loading: undefined });
        return items;
      })
      .catch((err: unknown) => {
        if (this.liveSnapshot === entry) this.liveSnapshot = previous;
        throw err;
      });
    return entry;
  }

  markSoldOut(id: string): void {
    if (this.soldOut.size > 10_000) this.soldOut.clear();
    this.soldOut.set(id, Date.now() + this.config.COUPON_CACHE_TTL_MS);
  }

  isSoldOut(id: string): boolean {
    return (this.soldOut.get(id) ?? 0) > Date.now();
  }

  async view(id: string): Promise<CouponView> {
    const [coupon, stock] = await Promise.all([this.coupons.findOneBy({ id }), this.stock.find(this.coupons.manager, id)]);
    if (!coupon || !stock) throw new AppError('COUPON_NOT_FOUND', `Coupon ${id} does not exist`);
    return toCouponView(coupon, stock);
  }

  /** Newest first, each with its stock; `nextCursor` is the last id of the page. */
  async list(limit: number, cursor?: string): Promise<Page<CouponView>> {
    const rows = await this.coupons.find({ where: cursor ? { id: LessThan(cursor) } : {}, order: { id: 'DESC' }, take: limit + 1 });
    const { items, nextCursor } = toPage(rows, limit, (c) => c);
    const stocks = await Promise.all(items.map((c) => this.stock.find(this.coupons.manager, c.id)));
    // Coupon and stock row are created in one transaction: a coupon without one is not listed.
    return { items: items.flatMap((c, i) => (stocks[i] ? [toCouponView(c, stocks[i])] : [])), nextCursor };
  }

  /** What a live page polls: the template from the grab path's cache and one primary-key read of the stock row. */
  async live(id: string): Promise<{ status: Coupon['status']; initStock: number; remainingStock: number }> {
    const coupon = await this.template(id);
    const stock = await this.stock.find(this.coupons.manager, id);
    if (!stock) throw new AppError('COUPON_NOT_FOUND', `Coupon ${id} does not exist`);
    return { status: coupon.status, initStock: stock.initStock, remainingStock: stock.stock };
  }

  /** Counts by status as clients see it (effectiveStatus). */
  counts(id: string) {
    return countByStatus(this.coupons.manager, id);
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

  async adjustStock(id: string, delta: number): Promise<CouponView> {
    if (delta === 0) throw validationFailed({ delta: ['must not be 0'] });
    await this.template(id);
    await this.tx.inTransaction((em) => this.stock.adjust(em, id, delta));
    this.invalidate(id);
    return this.view(id);
  }
}
