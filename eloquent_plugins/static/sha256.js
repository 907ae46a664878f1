/*
 * SHA-256, incremental and synchronous, for the stream digest (control.js). No core mirror: Python has hashlib,
 * and crypto.subtle is neither incremental nor synchronous. Separate: 80 lines of arithmetic nothing else needs.
 */

import { toHex } from "./bytes.js";

const K256 = new Uint32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
  0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
  0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
  0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
  0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
  0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
  0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
  0xc67178f2,
]);

/** Incremental, synchronous SHA-256 (crypto.subtle is neither), for the stream digest. */
export class Sha256 {
  constructor() {
    this.h = new Uint32Array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19]);
    this.block = new Uint8Array(64);
    this.fill = 0;
    this.length = 0; // bytes
    this.w = new Uint32Array(64);
  }
  update(bytes) {
    let i = 0;
    this.length += bytes.length;
    while (i < bytes.length) {
      const take = Math.min(64 - this.fill, bytes.length - i);
      this.block.set(bytes.subarray(i, i + take), this.fill);
      this.fill += take;
      i += take;
      if (this.fill === 64) {
        this.compress(this.block);
        this.fill = 0;
      }
    }
    return this;
  }
  compress(b) {
    const w = this.w, h = this.h;
    for (let t = 0; t < 16; t++) w[t] = (b[t * 4] << 24) | (b[t * 4 + 1] << 16) | (b[t * 4 + 2] << 8) | b[t * 4 + 3];
    for (let t = 16; t < 64; t++) {
      const x = w[t - 15], y = w[t - 2];
      const s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3);
      const s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10);
      w[t] = (w[t - 16] + s0 + w[t - 7] + s1) | 0;
    }
    let [a, bb, c, d, e, f, g, hh] = h;
    for (let t = 0; t < 64; t++) {
      const S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
      const ch = (e & f) ^ (~e & g);
      const t1 = (hh + S1 + ch + K256[t] + w[t]) | 0;
      const S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
      const maj = (a & bb) ^ (a & c) ^ (bb & c);
      const t2 = (S0 + maj) | 0;
      hh = g; g = f; f = e; e = (d + t1) | 0; d = c; c = bb; bb = a; a = (t1 + t2) | 0;
    }
    h[0] += a; h[1] += bb; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
  }
  /** The digest of what was fed so far (the hash can go on being updated). */
  digest() {
    const saved = { h: this.h.slice(), block: this.block.slice(), fill: this.fill, length: this.length };
    const bits = this.length * 8;
    const pad = new Uint8Array(((this.fill < 56 ? 56 : 120) - this.fill) + 8);
    pad[0] = 0x80;
    const n = pad.length;
    const hi = Math.floor(bits / 0x100000000), lo = bits >>> 0;
    pad[n - 8] = hi >>> 24; pad[n - 7] = (hi >>> 16) & 0xff; pad[n - 6] = (hi >>> 8) & 0xff; pad[n - 5] = hi & 0xff;
    pad[n - 4] = lo >>> 24; pad[n - 3] = (lo >>> 16) & 0xff; pad[n - 2] = (lo >>> 8) & 0xff; pad[n - 1] = lo & 0xff;
    this.update(pad);
    const out = new Uint8Array(32);
    for (let i = 0; i < 8; i++) {
      out[i * 4] = this.h[i] >>> 24; out[i * 4 + 1] = (this.h[i] >>> 16) & 0xff;
      out[i * 4 + 2] = (this.h[i] >>> 8) & 0xff; out[i * 4 + 3] = this.h[i] & 0xff;
    }
    this.h = saved.h; this.block = saved.block; this.fill = saved.fill; this.length = saved.length;
    return out;
  }
  hexdigest() {
    return toHex(this.digest());
  }
}
