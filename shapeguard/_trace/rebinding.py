"""Python attention functions that no TorchFunctionMode sees (flash-attn's entry points,
torch's `flex_attention` and `varlen_attn`), rebound while a trace is open to wrappers
that route each call through the session: where the originals are bound, and the wrapper.
"""

import functools
import sys
import threading
import types


def bound_names(found: dict[int, object], modules) -> list[tuple[dict, str]]:
    """Every (module globals, name) of `modules` bound to one of the `found` functions
    (by id): the defining module's attribute and each `from ... import` of it."""
    locations = []
    for mod in modules:
        if isinstance(mod, types.ModuleType):
            namespace = vars(mod)
            locations += [
                (namespace, name)
                for name, value in list(namespace.items())
                if id(value) in found and found[id(value)] is value
            ]
    return locations


def wrap(original, *, compiled: bool = False):
    """A wrapper of `original` that hands each call to the calling context's open session
    (which checks it, runs it with the interceptor quiet, and records one event named after
    the original); outside a trace, in another thread and under torch.compile it is the
    original itself. `compiled`: the original runs code compiled by torch.compile, so it
    runs with the interceptor off the mode stack (`interceptor.off_stack`), after the
    checks, as an untraced call runs it."""
    run = original
    if compiled:

        @functools.wraps(original)
        def run(*args, **kwargs):
            from .interceptor import off_stack

            return off_stack(original, args, kwargs)

    @functools.wraps(original)
    def checked(*args, **kwargs):
        __tracebackhide__ = True
        import torch

        if torch.compiler.is_compiling():  # dynamo traces the original: the plain graph
            return original(*args, **kwargs)
        from .current import current_session

        session = current_session()
        if session is None:  # another thread, or called after the trace closed
            return run(*args, **kwargs)
        return session.dispatch(run, args, kwargs)

    checked.__shapeguard_original__ = original  # type: ignore[attr-defined]  # a marker on the wrapper
    return checked


def wrap_unchecked(original, flag: str | None = None):
    """A wrapper of `original`, a function that runs code compiled by torch.compile and
    that shapeguard does not check: run with the interceptor off the mode stack, so the
    compiled code is the untraced call's (`interceptor.off_stack`). `flag`: only calls that
    pass this keyword true run compiled code; the others are the original's, traced."""

    @functools.wraps(original)
    def unmoded(*args, **kwargs):
        __tracebackhide__ = True
        import torch

        if torch.compiler.is_compiling() or (flag is not None and not kwargs.get(flag)):
            return original(*args, **kwargs)
        from .interceptor import off_stack

        return off_stack(original, args, kwargs)

    unmoded.__shapeguard_original__ = original  # type: ignore[attr-defined]  # a marker on the wrapper
    return unmoded


class Rebinder:
    """The functions `find()` returns (id -> function; never imported here: only those of
    modules already loaded), rebound to wrappers from the first `patch` to the last
    `restore`. One per family: flash-attn's (`flash.py`), torch's (`torch_entries.py`)."""

    def __init__(self, find, on_restore=None, wrapper=wrap) -> None:
        self._find = find
        self._wrapper = wrapper  # function -> its wrapper
        self._on_restore = on_restore  # called when the last restore has put them back
        self._lock = threading.RLock()
        self._depth = 0
        self.bindings: list[tuple[dict, str, object, object]] = []
        self._scan_key: tuple = ()  # scan sys.modules again only when it or `found` changed
        self._plan: list[tuple[dict, str, object, object]] = []  # what the last scan found

    def patch(self) -> bool:
        """One reference more; the first rebinds. Never raises. True: pass it to `restore`."""
        with self._lock:
            self._depth += 1
            if self._depth == 1:
                try:
                    self._install()
                except Exception:  # a broken module must not stop the trace from opening
                    self._uninstall()
            return True

    def restore(self, held: bool) -> None:
        """One reference less; the last puts every original back. Never raises."""
        if not held:
            return
        with self._lock:
            self._depth = max(0, self._depth - 1)
            if self._depth == 0:
                self._uninstall()

    def forget_scan(self) -> None:
        """Scan `sys.modules` again at the next `patch`: a namespace run in place of a
        module (runpy's `__main__`) changes no module count the cache could see."""
        self._scan_key = ()

    def _install(self) -> None:
        found = {
            key: func
            for key, func in self._find().items()
            if not hasattr(func, "__shapeguard_original__")
        }
        if not found:
            return
        key = (len(sys.modules), frozenset(found))
        if key != self._scan_key:
            # The bindings to make, wrappers included, are made once per scan: a session
            # that opens after it makes no object (tests/test_gc_pressure.py counts them).
            wrappers = {ident: self._wrapper(func) for ident, func in found.items()}
            self._plan = [
                (namespace, name, found[id(namespace[name])], wrappers[id(namespace[name])])
                for namespace, name in bound_names(found, list(sys.modules.values()))
            ]
            self._scan_key = key
        for binding in self._plan:
            namespace, name, original, wrapper = binding
            if namespace.get(name) is original:
                namespace[name] = wrapper
                self.bindings.append(binding)

    def _uninstall(self) -> None:
        bindings, self.bindings[:] = list(self.bindings), []
        for namespace, key, original, wrapper in reversed(bindings):
            try:
                if namespace.get(key) is wrapper:  # leave a name the user rebound meanwhile
                    namespace[key] = original
            except Exception:
                continue
        if self._on_restore is not None:
            self._on_restore()
