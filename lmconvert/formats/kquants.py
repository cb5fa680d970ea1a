"""llama.cpp's K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) encoded bit for bit as its reference
quantizer encodes them: `quantize_row_q{2..6}_K_ref` in ggml/src/ggml-quants.c, which is what
`llama_model_quantize` (`llama-quantize`) runs without an importance matrix.

Every float operation is C's, in C's order, in float32: the magic-number rounding of `nearest_int`
(garbage included, for arguments past 2**22), each running sum added one term at a time from 0, each
running maximum by strict `>` from its start, ggml's own fp32 -> fp16 conversion of the block scales.
ggml-quants.c is compiled into libggml-base for the baseline ISA whatever the build's CPU flags (they
go to ggml-cpu only), so on x86-64 no multiply-add is fused (its disassembly has no FMA instruction)
and nothing depends on AVX2/AVX-512. The work is vectorized across sub-blocks: arrays are laid out
[element of the sub-block, sub-block], so a sum over a sub-block is a chain of vector adds that keeps
C's order for every sub-block at once.
"""

from __future__ import annotations

import numpy as np

QK_K = 256
BLOCK_BYTES = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
BLOCKS_PER_STEP = 1024  # super-blocks encoded at a time: few enough passes of numpy over 1 MiB arrays

_F32 = np.float32
_MAGIC = _F32(12582912.0)  # 1.5 * 2**23
_EPS = _F32(1e-15)  # GROUP_MAX_EPS


def _nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: (bits of v + 1.5*2**23) & 0x7fffff, less 2**22 (round half to even for
    |v| <= 2**22, C's garbage past that)."""
    return ((v + _MAGIC).view(np.int32) & 0x7FFFFF) - 0x400000


def _clipped(v: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """nearest_int(v) clamped to [lo, hi], as float32 (exact small integers)."""
    return np.clip(_nearest_int(v), lo, hi).astype(_F32)


def _sum(terms: np.ndarray) -> np.ndarray:
    """C's `float s = 0; for (i...) s += terms[i];` along axis 0, for every column at once. numpy
    reduces a C-contiguous array along its outer axis row after row, in order (pairwise summation
    is for the inner axis only): tests/test_kquants.py checks it against the loop."""
    return np.add.reduce(terms, axis=0, initial=_F32(0))


def _sum_from_first(terms: np.ndarray) -> np.ndarray:
    """C's `float s = terms[0]; for (i = 1...) s += terms[i];`: from -0, which adds nothing (a sum
    from numpy's identity +0 turns a first -0 into +0)."""
    return np.add.reduce(terms, axis=0, initial=_F32(-0.0))


def _bits(mask: np.ndarray) -> np.ndarray:
    """A boolean mask as int32 0 / -1, for _put."""
    return np.negative(mask.view(np.int8)).astype(np.int32)


def _put(dst: np.ndarray, src: np.ndarray | np.floating, bits: np.ndarray) -> None:
    """dst = src where bits (from _bits; broadcast along dst's first axis), in place, by bitwise
    selection on the float32 bit patterns: exact, and several times faster than np.copyto's where."""
    d = dst.view(np.int32)
    t = np.bitwise_xor(np.asarray(src, _F32).view(np.int32), d)
    t &= bits
    d ^= t


def _first_max(values: np.ndarray, finite: bool) -> np.ndarray:
    """C's `if (values[i] > best) best = values[i];` from best = 0, along axis 0."""
    if finite:
        top = np.maximum.reduce(values, axis=0)
        return np.where(top > 0, top, _F32(0))
    best = np.zeros(values.shape[1:], _F32)
    for v in values:
        np.copyto(best, v, where=v > best)
    return best


def _abs_max(x: np.ndarray, finite: bool) -> tuple[np.ndarray, np.ndarray]:
    """C's `ax = fabsf(x[i]); if (ax > amax) { amax = ax; max = x[i]; }` from 0, along axis 0:
    (amax, max), max being the first x of the largest magnitude."""
    if finite:  # max is the column's largest value or its smallest, whichever is larger in magnitude
        pos, neg = np.maximum.reduce(x, axis=0), np.minimum.reduce(x, axis=0)
        amax = np.maximum(np.abs(pos), np.abs(neg))
        top = np.where(pos > -neg, pos, neg)
        tied = np.flatnonzero((pos == -neg) & (amax > 0))  # both signs: the first of them
        if len(tied):
            sub = x[:, tied]
            first = np.argmax(np.abs(sub) == amax[tied], axis=0)
            top[tied] = sub[first, np.arange(len(tied))]
        top[amax == 0] = _F32(0)
        return amax, top
    amax = np.zeros(x.shape[1:], _F32)
    top = np.zeros(x.shape[1:], _F32)
    for a, v in zip(np.abs(x), x, strict=True):
        better = a > amax
        np.copyto(amax, a, where=better)
        np.copyto(top, v, where=better)
    return amax, top


def _finite(x: np.ndarray) -> bool:
    return bool(np.isfinite(x).all())


def fp16_bits(f: np.ndarray) -> np.ndarray:
    """ggml_compute_fp32_to_fp16 (the FP16 library's, which ggml-base uses): round half to even,
    overflow to Inf, every NaN to 0x7E00 with its sign."""
    f = np.ascontiguousarray(f, dtype=_F32)
    with np.errstate(over="ignore"):
        base = (np.abs(f) * _F32(2.0**112)) * _F32(2.0**-110)
    w = f.view(np.uint32)
    shl1 = w + w
    sign = w & np.uint32(0x80000000)
    bias = np.maximum(shl1 & np.uint32(0xFF000000), np.uint32(0x71000000))
    base = ((bias >> np.uint32(1)) + np.uint32(0x07800000)).view(_F32) + base
    bits = base.view(np.uint32)
    nonsign = ((bits >> np.uint32(13)) & np.uint32(0x7C00)) + (bits & np.uint32(0x0FFF))
    out = (sign >> np.uint32(16)) | np.where(shl1 > np.uint32(0xFF000000), np.uint32(0x7E00), nonsign)
    return out.astype(np.uint16)


def _fp16_round(f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the fp16 bits of f, those bits back as float32)."""
    bits = fp16_bits(f)
    return bits, bits.view(np.float16).astype(_F32)


def _round_into(v: np.ndarray, out: np.ndarray, lo: int, hi: int, exact: bool) -> None:
    """out = clamp(nearest_int(v), lo, hi) as float32; v is overwritten. Where every |v| is known to
    be under 2**21 (not `exact`), nearest_int is (v + 1.5*2**23) - 1.5*2**23 in float32 (the same
    integer, in fewer passes over memory)."""
    np.add(v, _MAGIC, out=v)
    if exact:
        bits = v.view(np.int32)
        np.bitwise_and(bits, 0x7FFFFF, out=bits)
        np.subtract(bits, 0x400000, out=bits)
        np.clip(bits, lo, hi, out=bits)
        out[...] = bits
    else:
        np.subtract(v, _MAGIC, out=v)
        np.clip(v, _F32(lo), _F32(hi), out=out)


_SAFE = _F32(2.0**21)


def _make_qkx2(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int,
               use_mad: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """make_qkx2_quants for every sub-block (column) of x [n, S] with weights w: (scale, the_min, L,
    each column's largest |x| or None where x is not all finite).
    The levels of the best step are recomputed once at the end from that step's iscale and min."""
    finite = _finite(x)
    if finite:  # the same values; a zero's sign, which may differ, never reaches a byte written
        lo, hi = np.minimum.reduce(x, axis=0), np.maximum.reduce(x, axis=0)
    else:  # C's loop exactly: a NaN first value stays, later ones are passed over
        lo, hi = x[0].copy(), x[0].copy()
        for xi in x[1:]:
            np.copyto(lo, xi, where=xi < lo)
            np.copyto(hi, xi, where=xi > hi)
    low = lo.copy()  # the column's own minimum: x - min lies within [low - min, hi - min]
    sum_w = _sum_from_first(w)
    sum_x = _sum_from_first(w * x)
    np.copyto(lo, _F32(0), where=lo > 0)
    flat = hi == lo
    start = lo.copy()
    fmax = _F32(nmax)
    t = np.empty_like(x)
    aux = np.empty_like(x)
    wl = np.empty_like(x)

    def levels_into(iscale: np.ndarray, out: np.ndarray) -> None:
        reach = np.abs(iscale) * np.maximum(np.abs(hi - lo), np.abs(low - lo))
        exact = not (finite and bool(((reach < _SAFE) | flat).all()))
        np.subtract(x, lo, out=t)
        np.multiply(t, iscale, out=t)
        _round_into(t, out, 0, nmax, exact)

    def error(scale: np.ndarray, minimum: np.ndarray, levels: np.ndarray) -> np.ndarray:
        np.multiply(levels, scale, out=t)
        np.add(t, minimum, out=t)
        np.subtract(t, x, out=t)
        if use_mad:
            np.abs(t, out=t)
        else:
            np.multiply(t, t, out=t)
        np.multiply(w, t, out=t)
        return _sum(t)

    iscale = fmax / (hi - lo)
    scale = _F32(1) / iscale
    levels_into(iscale, aux)
    best = error(scale, lo, aux)
    chosen_iscale, chosen_min = iscale, lo.copy()
    for step in range(nstep + 1):
        iscale = ((_F32(rmin) + _F32(rdelta) * _F32(step)) + fmax) / (hi - lo)
        levels_into(iscale, aux)
        np.multiply(w, aux, out=wl)
        sum_l = _sum(wl)
        np.multiply(wl, aux, out=t)
        sum_l2 = _sum(t)
        np.multiply(wl, x, out=t)
        sum_xl = _sum(t)
        det = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
        positive = _bits(this_min > 0)
        _put(this_min, _F32(0), positive)
        _put(this_scale, sum_xl / sum_l2, positive)
        cur = error(this_scale, this_min, aux)
        better = _bits((det > 0) & (cur < best))
        _put(best, cur, better)
        _put(scale, this_scale, better)
        _put(chosen_iscale, iscale, better)
        _put(chosen_min, lo, better)
        _put(lo, this_min, better)
    # the levels each column last kept: those of the step that set its scale, from that step's min
    final_lo, lo = lo, chosen_min
    levels_into(chosen_iscale, aux)
    flat_at = np.flatnonzero(flat)  # few: assigned by index (a broadcast where is slow)
    aux[:, flat_at] = _F32(0)
    scale[flat_at] = _F32(0)
    final_lo[flat_at] = start[flat_at]
    return scale, -final_lo, aux, (np.maximum(np.abs(low), np.abs(hi)) if finite else None)


def _make_qx(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """make_qx_quants with rmse_type 1 and no weights (Q6_K): (scale, L, largest |x| as _make_qkx2's)
    for each column of x. The
    levels of the best try are recomputed once at the end from its iscale."""
    finite = _finite(x)
    amax, top = _abs_max(x, finite)
    zero = amax < _EPS
    fmax = _F32(nmax)
    w = x * x
    wx = w * x
    t = np.empty_like(x)
    lv = np.empty_like(x)

    def fit(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        exact = not (finite and bool(((np.abs(iscale) * amax < _SAFE) | zero).all()))
        np.multiply(x, iscale, out=t)
        _round_into(t, lv, -nmax, nmax - 1, exact)
        np.multiply(wx, lv, out=t)
        slx = _sum(t)
        np.multiply(w, lv, out=t)
        np.multiply(t, lv, out=t)
        return slx, _sum(t)

    chosen = -fmax / top
    sumlx, suml2 = fit(chosen)
    scale = np.where(suml2 != 0, sumlx / suml2, _F32(0))
    best = scale * sumlx
    for step in (*range(-9, 0), *range(1, 10)):
        iscale = -(fmax + _F32(0.1) * _F32(step)) / top
        slx, sl2 = fit(iscale)
        better = _bits((sl2 > 0) & (slx * slx > best * sl2))
        _put(chosen, iscale, better)
        _put(scale, slx / sl2, better)
        _put(best, scale * slx, better)
    fit(chosen)
    lv += fmax
    zero = np.flatnonzero(zero)
    lv[:, zero] = _F32(0)
    scale[zero] = _F32(0)
    return scale, lv, (amax if finite else None)


def _q3_pass(x: np.ndarray, w: np.ndarray, wx: np.ndarray, levels: np.ndarray, sumlx: np.ndarray,
             suml2: np.ndarray, nmax: int) -> np.ndarray:
    """One pass of make_q3_quants' refinement over the 16 values of each column, in place; returns
    which columns changed a level (those that did not are done: C leaves the loop). Few columns
    have a candidate at each value: the rest of the test and the updates run on those alone."""
    changed = np.zeros(x.shape[1], bool)
    for i in range(len(x)):
        li = levels[i]
        slx = sumlx - wx[i] * li
        sl2 = suml2 - (w[i] * li) * li
        new = _clipped((x[i] * sl2) / slx, -nmax, nmax - 1)
        at = np.flatnonzero((slx > 0) & (new != li))
        if not len(at):
            continue
        cand = new[at]
        slx_new = slx[at] + wx[i, at] * cand
        sl2_new = sl2[at] + (w[i, at] * cand) * cand
        old_lx, old_l2 = sumlx[at], suml2[at]
        take = (sl2_new > 0) & ((slx_new * slx_new) * old_l2 > (old_lx * old_lx) * sl2_new)
        at = at[take]
        li[at] = cand[take]
        sumlx[at] = slx_new[take]
        suml2[at] = sl2_new[take]
        changed[at] = True
    return changed


def _make_q3(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """make_q3_quants(16, 4, x, L, do_rmse=true) for each column of x: (scale, L, largest |x| as
    _make_qkx2's). After each pass of
    the refinement only the columns still changing go on, gathered together."""
    nmax = 4
    finite = _finite(x)
    amax, top = _abs_max(x, finite)
    zero = amax < _EPS
    levels = np.empty_like(x)
    # |x| <= |max|: the rounded values lie within [-4, 4] (NaN in an all-zero column, reset below)
    _round_into((_F32(-nmax) / top) * x, levels, -nmax, nmax - 1, not finite)
    w = x * x
    wx = w * x
    sumlx = _sum(wx * levels)
    suml2 = _sum((w * levels) * levels)
    changed = _q3_pass(x, w, wx, levels, sumlx, suml2, nmax)  # every column (an all-zero one is reset below)
    going = np.flatnonzero(changed & ~zero)
    for _ in range(4):
        if not len(going):
            break
        part = [a.take(going, axis=-1) for a in (x, w, wx, levels, sumlx, suml2)]
        changed = _q3_pass(*part, nmax)
        levels[:, going], sumlx[going], suml2[going] = part[3], part[4], part[5]
        going = going[changed]
    levels += _F32(nmax)
    scale = np.where(suml2 > 0, sumlx / suml2, _F32(0))
    zero = np.flatnonzero(zero)
    levels[:, zero] = _F32(0)
    scale[zero] = _F32(0)
    return scale, levels, (amax if finite else None)


def _columns(blocks: np.ndarray, n: int) -> np.ndarray:
    """[B, 256] -> [n, B * 256/n]: column b*(256/n) + j is sub-block j of block b."""
    return np.ascontiguousarray(blocks.reshape(-1, n).T)


def _rows(cols: np.ndarray, blocks: int) -> np.ndarray:
    """The inverse of _columns, for levels (small non-negative integers): [n, S] -> [B, 256] uint8."""
    return cols.astype(np.uint8).T.reshape(blocks, QK_K)


def _requantize(x: np.ndarray, amax: np.ndarray | None, levels: np.ndarray, d: np.ndarray,
                dm: np.ndarray | None, lo: int, hi: int, shift: int) -> None:
    """The second pass: each sub-block whose d is not 0 re-rounded against its stored scale (and
    min). `amax`, each column's largest |x| (None: x is not all finite), bounds the values rounded."""
    v = x / d if dm is None else (x + dm) / d
    nonzero = d != 0
    exact = amax is None
    if not exact:
        reach = (amax if dm is None else amax + np.abs(dm)) / np.abs(d)
        exact = not bool(((reach < _SAFE) | ~nonzero).all())
    fresh = np.empty_like(v)
    _round_into(v, fresh, lo, hi, exact)
    fresh += _F32(shift)
    _put(levels, fresh, _bits(nonzero))


def _pack2(q: np.ndarray) -> np.ndarray:
    """[B, 256] uint8 of 2-bit values -> [B, 64]: byte j/4 + l of each 128 holds l, l+32, l+64, l+96."""
    q = q.reshape(-1, 2, 4, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(-1, 64)


def _bit_planes(high: np.ndarray) -> np.ndarray:
    """[B, 8, 32] booleans -> [B, 32] bytes whose bit k is plane k."""
    out = high[:, 0].astype(np.uint8)
    for k in range(1, 8):
        out |= high[:, k].astype(np.uint8) << k
    return out


def _pack_k4_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's 12 bytes of eight 6-bit scales and mins ([B, 8] each, <= 63)."""
    out = np.zeros((ls.shape[0], 12), np.int32)
    out[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    out[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    return out


def _q2_k(blocks: np.ndarray) -> np.ndarray:
    nb = len(blocks)
    x = _columns(blocks, 16)
    scales, mins, levels, amax = _make_qkx2(x, np.abs(x), 3, -0.5, 0.1, 15, True)
    scales, mins = scales.reshape(nb, 16), mins.reshape(nb, 16)
    max_scale = _first_max(scales.T, _finite(scales))
    max_min = _first_max(mins.T, _finite(mins))
    has_scale, has_min = max_scale > 0, max_min > 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q4 = _F32(15)
        sc = np.where(has_scale[:, None], _nearest_int((q4 / max_scale)[:, None] * scales), 0)
        mn = np.where(has_min[:, None], _nearest_int((q4 / max_min)[:, None] * mins), 0)
        packed = (sc & 0xFF) | ((mn << 4) & 0xFF)
        d_bits, d = _fp16_round(np.where(has_scale, max_scale / q4, _F32(0)))
        m_bits, dmin = _fp16_round(np.where(has_min, max_min / q4, _F32(0)))
        sub_d = (d[:, None] * (packed & 0xF).astype(_F32)).reshape(-1)
        sub_m = (dmin[:, None] * (packed >> 4).astype(_F32)).reshape(-1)
        _requantize(x, amax, levels, sub_d, sub_m, 0, 3, 0)
    out = np.empty((nb, 84), np.uint8)
    out[:, 0:16] = packed
    out[:, 16:80] = _pack2(_rows(levels, nb))
    out[:, 80:82] = d_bits.view(np.uint8).reshape(nb, 2)
    out[:, 82:84] = m_bits.view(np.uint8).reshape(nb, 2)
    return out


def _q3_k(blocks: np.ndarray) -> np.ndarray:
    nb = len(blocks)
    x = _columns(blocks, 16)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scales, levels, amax = _make_q3(x)
        scales = scales.reshape(nb, 16)
        _, max_scale = _abs_max(scales.T, _finite(scales))
        has = max_scale != 0
        iscale = _F32(-32) / max_scale
        raw = _nearest_int(iscale[:, None] * scales)
        l8 = ((raw + 128) & 0xFF) - 128  # C's int -> int8_t
        ls = np.where(has[:, None], np.clip(l8, -32, 31) + 32, 0)
        d_bits, d = _fp16_round(np.where(has, _F32(1) / iscale, _F32(0)))
        sub_d = (d[:, None] * (ls - 32).astype(_F32)).reshape(-1)
        np.copyto(sub_d, _F32(0), where=np.repeat(~has, 16))
        _requantize(x, amax, levels, sub_d, None, -4, 3, 4)
    q = _rows(levels, nb)
    out = np.empty((nb, 110), np.uint8)
    high = (q > 3).reshape(nb, 8, 32)
    out[:, 0:32] = _bit_planes(high)
    out[:, 32:96] = _pack2(q & 3)
    sc = np.zeros((nb, 12), np.int32)
    sc[:, 0:8] = (ls[:, 0:8] & 0xF) | ((ls[:, 8:16] & 0xF) << 4)
    hi2 = (ls >> 4).reshape(nb, 4, 4)  # [j/4, j%4]
    sc[:, 8:12] = (hi2 << (2 * np.arange(4))[None, :, None]).sum(axis=1)
    out[:, 96:108] = sc
    out[:, 108:110] = d_bits.view(np.uint8).reshape(nb, 2)
    return out


def _q45_k(blocks: np.ndarray, nmax: int, rmin: float, nstep: int) -> tuple[np.ndarray, ...]:
    nb = len(blocks)
    x = _columns(blocks, 32)
    av = np.sqrt(_sum(x * x) / _F32(32))
    scales, mins, levels, amax = _make_qkx2(x, av + np.abs(x), nmax, rmin, 0.1, nstep, False)
    scales, mins = scales.reshape(nb, 8), mins.reshape(nb, 8)
    max_scale = _first_max(scales.T, _finite(scales))
    max_min = _first_max(mins.T, _finite(mins))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv_scale = np.where(max_scale > 0, _F32(63) / max_scale, _F32(0))
        inv_min = np.where(max_min > 0, _F32(63) / max_min, _F32(0))
        ls = np.minimum(_nearest_int(inv_scale[:, None] * scales) & 0xFF, 63)  # C's int -> uint8_t, then MIN
        lm = np.minimum(_nearest_int(inv_min[:, None] * mins) & 0xFF, 63)
        d_bits, d = _fp16_round(max_scale / _F32(63))
        m_bits, dmin = _fp16_round(max_min / _F32(63))
        sub_d = (d[:, None] * ls.astype(_F32)).reshape(-1)
        sub_m = (dmin[:, None] * lm.astype(_F32)).reshape(-1)
        _requantize(x, amax, levels, sub_d, sub_m, 0, nmax, 0)
    head = np.empty((nb, 16), np.uint8)
    head[:, 0:2] = d_bits.view(np.uint8).reshape(nb, 2)
    head[:, 2:4] = m_bits.view(np.uint8).reshape(nb, 2)
    head[:, 4:16] = _pack_k4_scales(ls, lm)
    return head, _rows(levels, nb).reshape(nb, 4, 2, 32)  # [64-chunk, low/high half, l]


def _q4_k(blocks: np.ndarray) -> np.ndarray:
    head, q = _q45_k(blocks, 15, -1.0, 20)
    return np.concatenate([head, (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)], axis=1)


def _q5_k(blocks: np.ndarray) -> np.ndarray:
    head, q = _q45_k(blocks, 31, -0.5, 15)
    qh = _bit_planes((q > 15).reshape(-1, 8, 32))  # bit 2c (+1) of qh[l]: chunk c, low (high) half
    ql = ((q[:, :, 0] & 15) | ((q[:, :, 1] & 15) << 4)).reshape(-1, 128)
    return np.concatenate([head, qh, ql], axis=1)


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    nb = len(blocks)
    x = _columns(blocks, 16)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scales, levels, amax_x = _make_qx(x, 32)
        scales = scales.reshape(nb, 16)
        amax, max_scale = _abs_max(scales.T, _finite(scales))
        zero = amax < _EPS
        iscale = _F32(-128) / max_scale
        d_bits, d = _fp16_round(_F32(1) / iscale)
        sc = np.minimum(127, _nearest_int(iscale[:, None] * scales))
        s8 = ((sc + 128) & 0xFF) - 128  # C's int -> int8_t
        sub_d = (d[:, None] * s8.astype(_F32)).reshape(-1)
        _requantize(x, amax_x, levels, sub_d, None, -32, 31, 32)
    q = _rows(levels, nb).reshape(nb, 2, 4, 32)  # [128-half, quarter, l]
    low, high = q & 0xF, q >> 4
    ql = np.stack([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=2)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    out = np.empty((nb, 210), np.uint8)
    out[:, 0:128] = ql.reshape(nb, 128)
    out[:, 128:192] = qh.reshape(nb, 64)
    out[:, 192:208] = s8
    out[:, 208:210] = d_bits.view(np.uint8).reshape(nb, 2)
    out[zero] = 0
    return out


ENCODERS = {"Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}


def quantize(rows: np.ndarray, kind: str) -> np.ndarray:
    """float32 rows [..., n] (n a multiple of 256) -> their `kind` blocks, [..., n/256 * block bytes]
    uint8, byte for byte what ggml_quantize_chunk writes for them without an importance matrix."""
    rows = np.ascontiguousarray(rows, dtype=_F32)
    if rows.shape[-1] % QK_K:
        raise ValueError(f"{kind}: a row of {rows.shape[-1]} values is not a whole number of {QK_K}-blocks")
    blocks = rows.reshape(-1, QK_K)
    out = np.empty((len(blocks), BLOCK_BYTES[kind]), np.uint8)
    encode = ENCODERS[kind]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for start in range(0, len(blocks), BLOCKS_PER_STEP):
            out[start:start + BLOCKS_PER_STEP] = encode(blocks[start:start + BLOCKS_PER_STEP])
    return out.reshape(*rows.shape[:-1], -1)


__all__ = ["BLOCK_BYTES", "ENCODERS", "QK_K", "fp16_bits", "quantize"]
