import { Injectable } from '@nestjs/common';

/** How far back the series reaches: the console's live chart shows the last five minutes. */
export const SERIES_SECONDS = 300;
/** Coupons tracked at once; past it the one idle longest is forgotten, so memory stays bounded. */
const MAX_TRACKED = 1000;

interface Slot {
  second: number;
  counts: Record<string, number>;
}

interface Track {
  /** Ring of SERIES_SECONDS slots; a slot counts only while its `second` is the one asked for. */
  slots: (Slot | undefined)[];
  lastSecond: number;
}

export interface GrabSeriesWindow {
  /** Epoch second of the first point; point i is second `from + i`. */
  from: number;
  seconds: number;
  /** Outcome (ISSUED, REPLAYED or the error code) -> count per second; outcomes absent from the window are left out. */
  outcomes: Record<string, number[]>;
}

/**
 * Grab outcomes per coupon and second, in this instance's memory. Recording is one map lookup and
 * one increment per grab, so the live page can poll the series every second at no database cost.
 * Each instance counts the grabs it answered; nothing survives a restart.
 */
@Injectable()
export class GrabSeries {
  private readonly tracks = new Map<string, Track>();

  record(couponId: string, outcome: string, nowMs = Date.now()): void {
    const second = Math.floor(nowMs / 1000);
    let track = this.tracks.get(couponId);
    if (!track) {
      if (this.tracks.size >= MAX_TRACKED) this.forgetIdlest();
      track = { slots: new Array<Slot | undefined>(SERIES_SECONDS), lastSecond: second };
      this.tracks.set(couponId, track);
    }
    const i = second % SERIES_SECONDS;
    let slot = track.slots[i];
    if (slot?.second !== second) track.slots[i] = slot = { second, counts: {} };
    slot.counts[outcome] = (slot.counts[outcome] ?? 0) + 1;
    track.lastSecond = second;
  }

  /** The last `seconds` seconds up to and including the current one. */
  read(couponId: string, seconds: number, nowMs = Date.now()): GrabSeriesWindow {
    const to = Math.floor(nowMs / 1000);
    const from = to - seconds + 1;
    const outcomes: Record<string, number[]> = {};
    const track = this.tracks.get(couponId);
    for (let t = from; track && t <= to; t++) {
      const slot = track.slots[t % SERIES_SECONDS];
      if (slot?.second !== t) continue;
      for (const [outcome, n] of Object.entries(slot.counts)) (outcomes[outcome] ??= new Array<number>(seconds).fill(0))[t - from] = n;
    }
    return { from, seconds, outcomes };
  }

  private forgetIdlest(): void {
    let idlest: string | undefined;
    let oldest = Infinity;
    for (const [id, track] of this.tracks) {
      if (track.lastSecond < oldest) [idlest, oldest] = [id, track.lastSecond];
    }
    if (idlest !== undefined) this.tracks.delete(idlest);
  }
}
