"""Decimal text to float64 for the libsvm parser: numba kernels on raw bytes.

:func:`_parse_number` parses a decimal float in a 1-D ``uint8`` buffer to exactly the float64 that
Python's ``float`` gives: Clinger's fast path (a mantissa of at most 18 digits below ``2**53`` and a
decimal exponent in [-22, 22]), else the Eisel-Lemire algorithm (any 18-digit mantissa; longer
mantissas when both ends of their truncation round alike). The rare token still ambiguous (near a
halfway point), overflowing, or holding underscores gets status 1, for the caller to finish with
Python's ``float``.

References
----------
W. D. Clinger, "How to read floating point numbers accurately", PLDI 1990.
D. Lemire, "Number parsing at a gigabyte per second", Software: Practice and Experience 51(8), 2021.
"""

from __future__ import annotations

import math

import numba
import numpy as np

__all__: list[str] = []  # private kernels of dufs.kernels.libsvm


_P10 = np.array([10.0**k for k in range(23)], dtype=np.float64)  # exact powers of ten
_TWO53 = 2**53


def _powers_of_five_128() -> tuple[np.ndarray, np.ndarray]:
    """5**q for q in [-342, 308] as 128-bit normalized significands (high, low words).

    The table of the fast_float library, computed here with Python integers.
    """
    hi, lo = [], []
    for q in range(-342, 309):
        if q < 0:
            p5 = 5**-q
            z = p5.bit_length()  # the smallest z with 2**z >= p5 (p5 is never a power of two)
            if q >= -27:
                c = 2 ** (z + 127) // p5 + 1
            else:
                c = 2 ** (2 * z + 128) // p5 + 1
                c >>= max(0, c.bit_length() - 128)
        else:
            c = 5**q
            c = c << (128 - c.bit_length()) if c.bit_length() < 128 else c >> (c.bit_length() - 128)
        hi.append(c >> 64)
        lo.append(c & (2**64 - 1))
    return np.array(hi, dtype=np.uint64), np.array(lo, dtype=np.uint64)


_P5_HI, _P5_LO = _powers_of_five_128()
_U1 = np.uint64(1)
_U32 = np.uint64(32)
_U63 = np.uint64(63)
_M32 = np.uint64(2**32 - 1)
_ALL_ONES = np.uint64(2**64 - 1)
_NOT_ONE = np.uint64(2**64 - 2)
_PRECISION_MASK = np.uint64((2**64 - 1) >> 55)  # 52 explicit bits + 3
_HIDDEN_BIT = np.uint64(2**52)
_MANTISSA_OVERFLOW = np.uint64(2**53)
_LZ_STEPS = np.array([2**32, 2**48, 2**56, 2**60, 2**62, 2**63], dtype=np.uint64)
_LZ_SHIFTS = np.array([32, 16, 8, 4, 2, 1], dtype=np.uint64)

_PLUS, _MINUS, _DOT, _UNDERSCORE = 43, 45, 46, 95

_jit = numba.njit(nogil=True, cache=True)
_jit_inline = numba.njit(
    nogil=True, cache=True, inline="always"
)  # small hot helpers: inlined in numba IR


@_jit
def _mul128(a, b):
    """The 128-bit product of two uint64 as (high, low)."""
    a_lo = a & _M32
    a_hi = a >> _U32
    b_lo = b & _M32
    b_hi = b >> _U32
    p0 = a_lo * b_lo
    p1 = a_lo * b_hi
    p2 = a_hi * b_lo
    mid = (p0 >> _U32) + (p1 & _M32) + (p2 & _M32)
    return a_hi * b_hi + (p1 >> _U32) + (p2 >> _U32) + (mid >> _U32), (p0 & _M32) | (mid << _U32)


@_jit
def _eisel_lemire(w, q):
    """The float64 nearest to w * 10**q for 0 < w < 2**64, q in [-342, 308]: (value, ok).

    ok is False when the rare ambiguous case (or an overflow to inf) needs the slow path.

    References
    ----------
    D. Lemire, "Number parsing at a gigabyte per second", Software: Practice and Experience 51(8),
    2021
    (``compute_float`` of the fast_float library).
    """
    lz = 0
    for j in range(6):
        if w < _LZ_STEPS[j]:
            w <<= _LZ_SHIFTS[j]
            lz += np.int64(_LZ_SHIFTS[j])
    hi, lo = _mul128(w, _P5_HI[q + 342])
    if (hi & _PRECISION_MASK) == _PRECISION_MASK:
        hi2, _ = _mul128(w, _P5_LO[q + 342])
        lo += hi2
        if hi2 > lo:
            hi += _U1
        if lo == _ALL_ONES and (q < -27 or q > 55):
            return 0.0, False
    upper = np.int64(hi >> _U63)
    shift = np.uint64(upper + 9)
    mant = hi >> shift
    power2 = ((217706 * q) >> 16) + 63 + upper - lz + 1023
    if power2 <= 0:  # subnormal (or the smallest normal after rounding)
        if 1 - power2 >= 64:
            return 0.0, True
        mant >>= np.uint64(1 - power2)
        mant += mant & _U1
        mant >>= _U1
        return math.ldexp(float(mant), -1074), True
    if lo <= _U1 and -4 <= q <= 23 and (mant & np.uint64(3)) == _U1 and (mant << shift) == hi:
        mant &= _NOT_ONE  # exactly halfway: round to even
    mant += mant & _U1
    mant >>= _U1
    if mant >= _MANTISSA_OVERFLOW:
        mant = _HIDDEN_BIT
        power2 += 1
    if power2 >= 2047:
        return 0.0, False
    return math.ldexp(float(mant), power2 - 1075), True


@_jit
def _parse_number_general(buf, i, n):
    """Parse a decimal float at i: (value, end, status).

    status 0: value is exact; 1: needs Python's ``float`` (underscores, ambiguous rounding,
    overflow); 2: not a number (end is where scanning stopped).
    """
    neg = False
    if i < n and (buf[i] == _MINUS or buf[i] == _PLUS):
        neg = buf[i] == _MINUS
        i += 1
    mant = 0
    nsig = 0  # significant digits held in mant (<= 18, so mant < 10**18 fits int64)
    ndig = 0
    dexp = 0
    slow = False
    trunc = False
    while i < n:
        d = np.int64(buf[i]) - 48
        if 0 <= d <= 9:
            ndig += 1
            if nsig < 18:
                mant = mant * 10 + d
                if mant != 0:
                    nsig += 1
            else:
                dexp += 1
                if d != 0:
                    trunc = True
            i += 1
        elif buf[i] == _UNDERSCORE:
            slow = True
            i += 1
        else:
            break
    if i < n and buf[i] == _DOT:
        i += 1
        while i < n:
            d = np.int64(buf[i]) - 48
            if 0 <= d <= 9:
                ndig += 1
                if nsig < 18:
                    mant = mant * 10 + d
                    dexp -= 1
                    if mant != 0:
                        nsig += 1
                elif d != 0:
                    trunc = True
                i += 1
            elif buf[i] == _UNDERSCORE:
                slow = True
                i += 1
            else:
                break
    if ndig == 0:
        return 0.0, i, 2
    if i < n and (buf[i] | 32) == 101:
        i += 1
        eneg = False
        if i < n and (buf[i] == _MINUS or buf[i] == _PLUS):
            eneg = buf[i] == _MINUS
            i += 1
        edig = 0
        ev = 0
        while i < n:
            d = np.int64(buf[i]) - 48
            if 0 <= d <= 9:
                edig += 1
                if ev < 100_000_000:
                    ev = ev * 10 + d
                i += 1
            elif buf[i] == _UNDERSCORE:
                slow = True
                i += 1
            else:
                break
        if edig == 0:
            return 0.0, i, 2
        dexp += -ev if eneg else ev
    if slow:
        return 0.0, i, 1
    if mant == 0:
        return (-0.0 if neg else 0.0), i, 0
    if dexp > 308:
        return 0.0, i, 1
    if dexp < -342:
        return (-0.0 if neg else 0.0), i, 0
    if trunc:  # the exact value lies in [mant, mant + 1) * 10**dexp
        v, ok = _eisel_lemire(np.uint64(mant), dexp)
        v2, ok2 = _eisel_lemire(np.uint64(mant + 1), dexp)
        if not (ok and ok2 and v == v2):
            return 0.0, i, 1
    elif mant < _TWO53 and 0 <= dexp <= 22:
        v = mant * _P10[dexp]
    elif mant < _TWO53 and -22 <= dexp < 0:
        v = mant / _P10[-dexp]
    else:
        v, ok = _eisel_lemire(np.uint64(mant), dexp)
        if not ok:
            return 0.0, i, 1
    return (-v if neg else v), i, 0


@_jit_inline
def _parse_number(buf, i, n):
    """:func:`_parse_number_general`, with a fast path for at most 18 digits and no underscores."""
    start = i
    neg = False
    if i < n and (buf[i] == _MINUS or buf[i] == _PLUS):
        neg = buf[i] == _MINUS
        i += 1
    mant = 0
    s = i
    while i < n:
        d = np.int64(buf[i]) - 48
        if d < 0 or d > 9:
            break
        mant = mant * 10 + d
        i += 1
    ndig = i - s
    dexp = 0
    if i < n and buf[i] == _DOT:
        i += 1
        s = i
        while i < n:
            d = np.int64(buf[i]) - 48
            if d < 0 or d > 9:
                break
            mant = mant * 10 + d
            i += 1
        ndig += i - s
        dexp = s - i
    if i < n and (buf[i] | 32) == 101:
        return _parse_number_general(buf, start, n)
    if ndig == 0 or ndig > 18 or (i < n and buf[i] == _UNDERSCORE):
        return _parse_number_general(buf, start, n)
    if mant == 0:
        return (-0.0 if neg else 0.0), i, 0
    if dexp < -22 or mant >= _TWO53:
        return _parse_number_general(buf, start, n)
    v = mant / _P10[-dexp] if dexp else float(mant)
    return (-v if neg else v), i, 0
