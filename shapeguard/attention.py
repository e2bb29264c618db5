"""Guarded attention: FlashAttention on a GPU, the same math with torch's SDPA anywhere else.

`flash_attention(q, k, v)` checks flash-attn's contract before any kernel runs and
says what is wrong in sizes, not only in names. Then it calls
`flash_attn.flash_attn_func` when the tensors are on an Ampere-or-newer CUDA GPU
and flash-attn imports; otherwise it runs `F.scaled_dot_product_attention` with
flash-attn's semantics kept: its [batch, seq, heads, d_k] layout, grouped-query
heads, a causal mask aligned to the bottom right, sliding windows, and zeros for a
query row that sees no key. The fallback is announced once per reason with a
`FlashFallbackWarning`.

Which rules apply where:
    shape rules (rank, batch, head size <= 256, k/v lengths and heads, GQA divisibility),
    one dtype and one device for q, k, v, and int32 cu_seqlens: everywhere, so code
    that passes on a laptop passes on the GPU;
    float16/bfloat16 only, CUDA only, a contiguous last axis: on the flash-attn path
    only; the fallback also takes float32 and float64.

Importing this module imports torch but never flash_attn.
"""

import sys
import warnings

import torch
import torch.nn.functional as F

from . import _config
from ._errors import ContractError, ContractTypeError
from ._trace import flash as _flash

__all__ = ["FlashFallbackWarning", "flash_attention", "flash_attention_varlen"]

LAYOUTS = ("bshd", "bhsd")
BACKENDS = ("auto", "flash", "sdpa")


class FlashFallbackWarning(UserWarning):
    """flash-attn cannot run these inputs here, so torch's SDPA computes the same attention.

    Raised once per reason per process. Silence it with
    `warnings.filterwarnings("ignore", category=shapeguard.attention.FlashFallbackWarning)`.
    """


_announced: set[str] = set()


def flash_attention(
    q,
    k,
    v,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    layout: str = "bshd",
    backend: str = "auto",
):
    """Attention with flash-attn's contract and semantics, on any device.

    Args:
        q: [batch, seq_q, heads, d_k] (or [batch, heads, seq_q, d_k] with layout="bhsd").
        k, v: [batch, seq_k, kv_heads, d_k]; heads must be a multiple of kv_heads (GQA).
        causal: mask the future, aligned to the bottom right when seq_q != seq_k
            (query i sees keys up to i + seq_k - seq_q), as flash-attn does.
        softmax_scale: defaults to 1 / sqrt(d_k).
        window_size: (left, right) keys each query sees around its diagonal; -1 is unbounded.
        layout: "bshd" (flash-attn's) or "bhsd" (SDPA's); the output has the same layout.
        backend: "auto" (flash-attn on CUDA when it imports, else SDPA with a
            FlashFallbackWarning), "flash" (flash-attn or an error), "sdpa" (always SDPA,
            no warning).

    Returns:
        The attention output, shaped and typed like q.

    Raises:
        ShapeError: the inputs break flash-attn's contract (the message names the rule).
        ContractError: an argument of this function is malformed.

    Examples:
        >>> import torch
        >>> from shapeguard.attention import flash_attention
        >>> q = torch.randn(2, 5, 3, 16)      # [batch, seq_q, heads, d_k]
        >>> kv = torch.randn(2, 7, 1, 16)     # [batch, seq_k, kv_heads, d_k]
        >>> flash_attention(q, kv, kv, causal=True, backend="sdpa").shape
        torch.Size([2, 5, 3, 16])
    """
    __tracebackhide__ = True
    _require_tensors("flash_attention", q=q, k=k, v=v)
    window = _window(window_size)
    _choice("layout", layout, LAYOUTS)
    _choice("backend", backend, BACKENDS)
    checking = _config.is_enabled() and not torch.compiler.is_compiling()
    path = _path(q, backend, announce=not torch.compiler.is_compiling())
    kwargs = {
        "causal": bool(causal),
        "softmax_scale": softmax_scale,
        "window_size": window,
        "layout": layout,
        "path": path,
    }
    if checking:
        from ._trace.current import current_session

        session = current_session()
        if session is not None:  # checked by checks/flash.py, recorded as one event
            return session.dispatch(_dense, (q, k, v), kwargs)
        from ._source import user_site

        site = user_site()
        names = [_flash.site_label(site, "flash_attention", i, n) for i, n in enumerate("qkv")]
        specs = [_flash.spec(n, t) for n, t in zip(names, (q, k, v), strict=True)]
        _flash.enforce(
            _flash.check_dense(*specs, op="flash_attention", flash=path == "flash", layout=layout),
            op="flash_attention",
            site=site,
        )
    return _dense(q, k, v, **kwargs)


def flash_attention_varlen(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    backend: str = "auto",
):
    """Variable-length attention over packed tokens, as `flash_attn_varlen_func`.

    Args:
        q: [total_q, heads, d_k], the query tokens of every sequence, back to back.
        k, v: [total_k, kv_heads, d_k].
        cu_seqlens_q, cu_seqlens_k: int32 [batch + 1], running totals of the sequence
            lengths from 0 to total_q (total_k).
        max_seqlen_q, max_seqlen_k: the longest query (key) sequence.
        causal, softmax_scale, window_size, backend: as for `flash_attention`, per sequence.

    Returns:
        [total_q, heads, d_k], typed like q.

    Examples:
        >>> import torch
        >>> from shapeguard.attention import flash_attention_varlen
        >>> cu = torch.tensor([0, 3, 8], dtype=torch.int32)   # two sequences: 3 and 5 tokens
        >>> q = torch.randn(8, 3, 16)
        >>> flash_attention_varlen(q, q, q, cu, cu, 5, 5, causal=True, backend="sdpa").shape
        torch.Size([8, 3, 16])
    """
    __tracebackhide__ = True
    op = "flash_attention_varlen"
    _require_tensors(op, q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    window = _window(window_size)
    _choice("backend", backend, BACKENDS)
    checking = _config.is_enabled() and not torch.compiler.is_compiling()
    path = _path(q, backend, announce=not torch.compiler.is_compiling())
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    kwargs: dict[str, object] = {
        "causal": bool(causal),
        "softmax_scale": softmax_scale,
        "window_size": window,
    }
    kwargs["path"] = path
    if checking:
        from ._trace.current import current_session

        session = current_session()
        if session is not None:
            return session.dispatch(_varlen, args, kwargs)
        from ._source import user_site

        site = user_site()
        names = [
            _flash.site_label(site, op, i, n)
            for i, n in enumerate(("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k"))
        ]
        _flash.enforce(
            _flash.check_varlen_args(names, args, op=op, flash=path == "flash"), op=op, site=site
        )
    return _varlen(*args, **kwargs)


# -- argument checks -------------------------------------------------------------------
def _require_tensors(op: str, **named) -> None:
    for name, value in named.items():
        if not isinstance(value, torch.Tensor):
            raise ContractTypeError(f"{op}: {name} is a {type(value).__name__}, not a tensor")


def _window(window_size) -> tuple[int, int]:
    ok = (
        isinstance(window_size, tuple | list)
        and len(window_size) == 2
        and all(isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window_size)
    )
    if not ok:
        # Ints of the wrong count or sign are a wrong value; anything else, a wrong type.
        numbers = isinstance(window_size, tuple | list) and all(
            isinstance(w, int) and not isinstance(w, bool) for w in window_size
        )
        raise (ContractError if numbers else ContractTypeError)(
            f"window_size={window_size!r} is not a (left, right) pair of ints >= -1; "
            "-1 leaves that side unbounded, (-1, -1) is full attention"
        )
    return int(window_size[0]), int(window_size[1])


def _choice(name: str, value, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        wrong = ContractError if isinstance(value, str) else ContractTypeError
        raise wrong(f"{name}={value!r} is not supported; use one of {allowed}")


# -- choosing the kernel -----------------------------------------------------------------
def _path(q, backend: str, announce: bool) -> str:
    """ "flash" or "sdpa", announcing the fallback once per reason when backend="auto"."""
    if backend == "sdpa":
        return "sdpa"
    if backend == "flash":
        return "flash"  # the contract's device rule, then the import, report what is missing
    device = getattr(q, "device", None)
    kind = getattr(device, "type", "cpu")
    if kind == "meta":
        return "sdpa"  # nothing runs on meta: only shapes, so nothing to announce
    if kind != "cuda":
        reason = f"q is on {kind}, and flash-attn runs on CUDA only"
    else:
        major, minor = torch.cuda.get_device_capability(device)
        module, failure = _load_flash()
        if module is None:
            reason = failure
        elif major < 8:
            reason = (
                f"this GPU has compute capability {major}.{minor}; flash-attn needs 8.0 "
                "(Ampere) or newer"
            )
        else:
            return "flash"
    if announce:
        _announce(reason)
    return "sdpa"


_import_failure: str | None = None


def _load_flash():
    """(flash_attn, "") or (None, why not). A failed import is tried once: it is slow and
    stays failed."""
    global _import_failure
    module = sys.modules.get("flash_attn")
    if module is not None:
        return module, ""
    if _import_failure is not None:
        return None, _import_failure
    try:
        import flash_attn
    except ImportError as error:
        if getattr(error, "name", None) == "flash_attn":
            _import_failure = "flash-attn is not installed (pip install flash-attn)"
        else:
            _import_failure = f"flash-attn failed to import ({type(error).__name__}: {error})"
    except Exception as error:  # a broken CUDA extension raises more than ImportError
        _import_failure = f"flash-attn failed to import ({type(error).__name__}: {error})"
    else:
        return flash_attn, ""
    return None, _import_failure


def _announce(reason: str) -> None:
    if reason in _announced:
        return
    _announced.add(reason)
    from ._source import user_site

    site = user_site()
    warnings.warn_explicit(
        FlashFallbackWarning(
            f"shapeguard.attention: {reason}; running torch's scaled_dot_product_attention "
            "with flash-attn's semantics instead"
        ),
        FlashFallbackWarning,
        site.filename if site else "<shapeguard>",
        site.lineno if site else 0,
    )


def _flash_module():
    module, failure = _load_flash()
    if module is None:
        raise ContractError(f"backend='flash' needs flash-attn, and {failure}")
    return module


# -- the kernels -------------------------------------------------------------------------
def _dense(q, k, v, *, causal, softmax_scale, window_size, layout, path):
    """Run one dense attention call on the chosen path; inputs are already checked."""
    if path == "flash":
        flash_attn = _flash_module()
        if layout == "bhsd":
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = flash_attn.flash_attn_func(
            q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size
        )
        return out.transpose(1, 2) if layout == "bhsd" else out
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    out = sdpa_flash_semantics(q, k, v, causal=causal, scale=softmax_scale, window=window_size)
    return out.transpose(1, 2) if layout == "bshd" else out


# The session names an op by its __name__: the trace shows this call as the user wrote it.
_dense.__name__ = _dense.__qualname__ = "flash_attention"
_dense.__shapeguard_flash_entry__ = True  # type: ignore[attr-defined]  # checks/flash.py reads it


def _varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, causal, softmax_scale, window_size, path):
    """Run one varlen call: flash-attn's kernel, or SDPA one sequence at a time."""
    if path == "flash":
        return _flash_module().flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, max_q, max_k,
            softmax_scale=softmax_scale, causal=causal, window_size=window_size,
        )  # fmt: skip
    if q.device.type == "meta":  # no offsets to read: the shape is all there is
        return q.new_empty(q.shape)
    starts_q, starts_k = cu_q.tolist(), cu_k.tolist()
    outs = []
    for b in range(len(starts_q) - 1):
        qb = q[starts_q[b] : starts_q[b + 1]].transpose(0, 1)[None]  # [1, heads, seq_q, d_k]
        kb = k[starts_k[b] : starts_k[b + 1]].transpose(0, 1)[None]
        vb = v[starts_k[b] : starts_k[b + 1]].transpose(0, 1)[None]
        ob = sdpa_flash_semantics(
            qb, kb, vb, causal=causal, scale=softmax_scale, window=window_size
        )
        outs.append(ob[0].transpose(0, 1))
    return torch.cat(outs, dim=0)


_varlen.__name__ = _varlen.__qualname__ = "flash_attention_varlen"
_varlen.__shapeguard_flash_entry__ = True  # type: ignore[attr-defined]  # checks/flash.py reads it


def sdpa_flash_semantics(q, k, v, *, causal=False, scale=None, window=(-1, -1)):
    """SDPA on [batch, heads, seq, d_k] tensors with flash-attn's masking rules.

    Query i sees key j when `i + seq_k - seq_q - left <= j <= i + seq_k - seq_q + right`
    (an unbounded side when it is -1); `causal` sets right to 0. A query that sees no key
    gets zeros, as flash-attn returns, not the NaN or the uniform average SDPA could give.
    """
    hq, hk = q.shape[1], k.shape[1]
    if hq != hk:  # flash-attn's GQA: query heads [g*i, g*(i+1)) share kv head i
        k = k.repeat_interleave(hq // hk, dim=1)
        v = v.repeat_interleave(hq // hk, dim=1)
    left, right = window
    if causal:
        right = 0
    sq, sk = q.shape[2], k.shape[2]
    if left < 0 and right < 0:
        return F.scaled_dot_product_attention(q, k, v, scale=scale)
    if left < 0 and right == 0 and sq == sk:  # square causal: top-left and bottom-right agree
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    offset = sk - sq
    rows = torch.arange(sq, device=q.device)[:, None]
    cols = torch.arange(sk, device=q.device)[None, :]
    lag = cols - rows - offset  # 0 on flash-attn's (bottom-right) diagonal
    allowed = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if left >= 0:
        allowed &= lag >= -left
    if right >= 0:
        allowed &= lag <= right
    empty = [i for i in range(sq) if _first_key(i, offset, left) > _last_key(i, offset, right, sk)]
    if not empty:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)
    blank = torch.zeros(sq, 1, dtype=torch.bool, device=q.device)
    blank[empty] = True
    # Let blank rows attend everywhere (no NaN in forward or backward), then zero them.
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | blank, scale=scale)
    return out.masked_fill(blank, 0.0)


def _first_key(i: int, offset: int, left: int) -> int:
    return 0 if left < 0 else max(0, i + offset - left)


def _last_key(i: int, offset: int, right: int, sk: int) -> int:
    return sk - 1 if right < 0 else min(sk - 1, i + offset + right)
