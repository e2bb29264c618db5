"""A recorded step's effects on the axes, relative to its inputs: captured while the
reference path records the op (`Capture`), made again by a replay (`apply`).
"""

from .._names import dims as D


class Outside(Exception):
    """A step's effects reach axes that are not its inputs' (or that it made)."""


class Effects:
    """What one step did to the axes, relative to its inputs.

    `paths` find the dims the template needs from the inputs' metas: `(0, i, a, j)` is the
    dim object of atom j of axis a of input i, `(1, i, a, j)` its root, `(2, k)` the root of
    the alias of the dim found by path k. Dims the step made follow them in the same list
    of objects; every reference below is an index into it."""

    __slots__ = (
        "paths",
        "news",
        "merges",
        "states",
        "changes",
        "templates",
        "simple",
    )

    def __init__(self, paths, news, merges, states, changes, outs) -> None:
        # Outputs made of the inputs' axes, nothing changed: most ops.
        self.simple = not (news or merges or states or changes)
        self.paths = paths
        self.news = news  # per dim made: (size, parent, state)
        self.merges = merges  # (root, new parent): roots unified into another
        self.states = states  # (root, state): roots whose facts changed
        self.changes = changes  # (input index, `Facts`): inputs' metas whose facts changed
        # Per output: (the template of its dims, for `build`; its `Facts`).
        self.templates = outs


_KEEP = -1  # an alias the step did not change


class Capture:
    """Records the effects of one step on the axes of its inputs (`begin`, then `end`)."""

    __slots__ = (
        "metas",
        "serial",
        "atom_ix",
        "root_ix",
        "paths",
        "snaps",
        "meta_snaps",
        "touched",
        "token",
    )

    def __init__(self, metas: list) -> None:
        self.metas = metas
        self.serial = D.serial()
        atom_ix: dict = {}
        root_ix: dict = {}
        paths: list = []
        for i, m in enumerate(metas):
            for a, axis in enumerate(m.dims):
                for j, atom in enumerate(axis):
                    d = atom[0]
                    if d not in atom_ix:
                        atom_ix[d] = len(paths)
                        paths.append((0, i, a, j))
                    r = d.find()
                    if r not in root_ix:
                        if r is d:
                            root_ix[r] = atom_ix[d]
                        else:
                            root_ix[r] = len(paths)
                            paths.append((1, i, a, j))
        frontier = list(root_ix)
        for _ in range(4):  # names read through aliases go four deep (`dims.dim_name`)
            found = []
            for r in frontier:
                alias = r.alias
                if alias is None:
                    continue
                ar = alias[0].find()
                if ar not in root_ix:
                    root_ix[ar] = len(paths)
                    paths.append((2, root_ix[r]))
                    found.append(ar)
            frontier = found
        self.atom_ix = atom_ix
        self.root_ix = root_ix
        self.paths = paths
        self.snaps = {r: D.state_of(r) for r in root_ix}
        self.meta_snaps = [(m.facts, m.dims) for m in metas]
        self.touched, self.token = D.watch()

    def abandon(self) -> None:
        D.unwatch(self.token)

    def end(self, out_metas: list) -> Effects:
        touched = self.touched
        D.unwatch(self.token)
        serial = self.serial
        atom_ix, root_ix = self.atom_ix, self.root_ix
        base = len(self.paths)
        news: list = []
        new_ix: dict = {}

        def ref(d) -> int:
            k = atom_ix.get(d)
            if k is None:
                k = root_ix.get(d)
            if k is None:
                if d.serial <= serial:
                    raise Outside
                k = new_ix.get(d)
                if k is None:
                    k = new_ix[d] = base + len(news)
                    news.append(d)
            return k

        for r in touched or ():
            if r not in root_ix and r.serial <= serial:
                raise Outside
        metas = self.metas
        dims_ix: dict = {}
        axis_ix: dict = {}
        for i, m in enumerate(metas):
            dims_ix.setdefault(m.dims, i)
            for a, axis in enumerate(m.dims):
                axis_ix.setdefault(axis, (i, a))
        outs = []
        for om in out_metas:
            at = dims_ix.get(om.dims)
            if at is not None:
                template: object = at
            else:
                axes = []
                for axis in om.dims:
                    ia = axis_ix.get(axis)
                    if ia is not None:
                        axes.append(ia)
                    else:
                        axes.append(tuple((ref(d), s, n) for d, s, n in axis))
                template = tuple(axes)
            outs.append((template, om.facts))
        merges, states = [], []
        for r, k in root_ix.items():
            top = r.find()
            if top is not r:
                merges.append((k, ref(top)))
                continue
            now = D.state_of(r)
            before = self.snaps[r]
            if now != before:
                alias = now.alias
                if alias is before.alias:
                    spec: object = _KEEP
                elif alias is None:
                    spec = None
                else:
                    spec = (ref(alias[0]), alias[1], alias[2])
                states.append((k, now._replace(alias=spec)))
        made = []
        k = 0
        while k < len(news):
            d = news[k]
            parent = ref(d.parent) if d.parent is not None else None
            alias = d.alias
            spec = (ref(alias[0]), alias[1], alias[2]) if alias is not None else None
            made.append((d.size, parent, D.state_of(d)._replace(alias=spec)))
            k += 1
        changes = []
        for i, m in enumerate(metas):
            facts, dims = self.meta_snaps[i]
            if m.dims is not dims or m.tags != facts.tags:
                raise Outside
            now = m.facts
            if now != facts:
                changes.append((i, now))
        return _compact(self.paths, made, merges, states, changes, outs)


def _compact(paths: list, made, merges, states, changes, outs) -> Effects:
    """The effects with only the paths they use (a template that reuses its inputs' axes
    whole needs none), references renumbered."""
    base = len(paths)
    used: set[int] = set()

    def use(k) -> None:
        while k is not None and k < base and k not in used:
            used.add(k)
            p = paths[k]
            k = p[1] if p[0] == 2 else None

    def alias_refs(state):
        alias = state.alias
        return () if alias is None or alias == _KEEP else (alias[0],)

    for template, _ in outs:
        if type(template) is not int:
            for t in template:
                if not (t and type(t[0]) is int):
                    for r, _, _ in t:
                        use(r)
    for root, parent in merges:
        use(root)
        use(parent)
    for root, state in states:
        use(root)
        for r in alias_refs(state):
            use(r)
    for _, parent, state in made:
        use(parent)
        for r in alias_refs(state):
            use(r)
    order = sorted(used)
    new = {k: i for i, k in enumerate(order)}
    shift = len(order) - base

    def ref(k):
        if k is None:
            return None
        return new[k] if k < base else k + shift

    def state_of(state):
        alias = state.alias
        if alias is None or alias == _KEEP:
            return state
        return state._replace(alias=(ref(alias[0]), alias[1], alias[2]))

    kept = tuple((2, new[p[1]]) if p[0] == 2 else p for p in (paths[k] for k in order))
    return Effects(
        kept,
        tuple((size, ref(parent), state_of(state)) for size, parent, state in made),
        tuple((ref(root), ref(parent)) for root, parent in merges),
        tuple((ref(root), state_of(state)) for root, state in states),
        tuple(changes),
        tuple(
            (
                template
                if type(template) is int
                else tuple(
                    t if t and type(t[0]) is int else tuple((ref(r), s, n) for r, s, n in t)
                    for t in template
                ),
                fields,
            )
            for template, fields in outs
        ),
    )


def resolve(paths: tuple, metas: list) -> list:
    """The dims `paths` find in `metas` (raises when the inputs do not have them)."""
    objs: list = []
    append = objs.append
    for p in paths:
        c = p[0]
        if c == 0:
            append(metas[p[1]].dims[p[2]][p[3]][0])
        elif c == 1:
            append(metas[p[1]].dims[p[2]][p[3]][0].find())
        else:
            append(objs[p[1]].alias[0].find())
    return objs


def _set_state(dim, state, objs: list) -> None:
    """Give `dim` a recorded `DimState`, its alias resolved in `objs` (or kept)."""
    alias = state.alias
    if alias is _KEEP:
        state = state._replace(alias=dim.alias)
    elif alias is not None:
        state = state._replace(alias=(objs[alias[0]], alias[1], alias[2]))
    D.restore(dim, state)


def apply(effects: Effects, objs: list | None, metas: list, made) -> None:
    """Make the step's effects on the dims `objs` (resolved from its inputs), and fill in
    `made`, its outputs' metas (made with their slots only: `owed.pending`)."""
    if effects.simple:
        outputs(effects.templates, objs, metas, made)
        return
    if objs is None:
        objs = []
    news = effects.news
    if news:
        dims = [D.Dim(size) for size, _, _ in news]
        objs.extend(dims)
        for dim, (_, parent, state) in zip(dims, news, strict=True):
            if parent is not None:
                dim.parent = objs[parent]
            _set_state(dim, state, objs)
    changed = bool(news)
    for root, parent in effects.merges:
        objs[root].parent = objs[parent]
        changed = True
    for root, state in effects.states:
        _set_state(objs[root], state, objs)
        changed = True
    for i, facts in effects.changes:
        metas[i].facts = facts
        changed = True
    if changed:
        D.names_changed()
    outputs(effects.templates, objs, metas, made)


def outputs(templates: tuple, objs: list | None, metas: list, made) -> None:
    """Fill in the outputs' metas of a step (`apply`)."""
    for (template, facts), meta in zip(templates, made, strict=True):
        meta.fill(build(template, metas, objs), facts)


def build(template, metas: list, objs: list | None) -> tuple:
    """An output's dims from its template (`Capture.end`): an input's dims whole (its
    index), else per axis an input's axis (`(input, axis)`) or atoms of the dims in `objs`
    (`((object index, stride, size), ...)`)."""
    if type(template) is int:
        return metas[template].dims
    return tuple(
        metas[t[0]].dims[t[1]]
        if t and type(t[0]) is int
        else tuple([(objs[r], stride, size) for r, stride, size in t])  # type: ignore[index]
        for t in template
    )
