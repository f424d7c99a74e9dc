"""Static deadlock check of a route set: the channel-dependency graph, proved acyclic or a cycle printed.

Every route set a compiler or a library kernel emits is checked here before
it is loaded (``docs/faults.md`` section 1). The graph's nodes are the
fabric's buffers (``docs/architecture.md`` sections 3 and 4.1):

* ``router (x, y) color c``: the router's FIFO of color ``c``;
* ``PE (x, y) input queue of color c``: the PE's ``rx`` queue of ``c``;
* ``PE (x, y) output queue``: its one ``tx`` queue, shared by every color.

An edge ``A -> B`` says that the wavelet at the head of ``A`` may wait for
room in ``B``:

* route edges: a FIFO waits for each target of its route, all of them for
  a multicast (the grant is atomic), a neighbour router's FIFO or its own
  PE's input queue (an edge port always takes a wavelet: no edge);
* ramp edges: the output queue waits for the router FIFO of the color at
  its head, for every color the PE sends that its router takes from RAMP
  (head-of-line blocking: one queue for every color);
* task edges, the receive-before-send dependencies the mapper knows: an
  input queue of a PE that also sends waits for that PE's output queue (the
  task that drains it may stall on a send before it has taken everything).

Per-color flow control makes the colors of one link independent (a full
FIFO lowers only its own ``ready`` bit), and arbitration rotates, so these
are the only waits on room. An acyclic graph means no set of full buffers
can wait on each other: no deadlock of buffers. A cycle is a possible
deadlock and :func:`check_routes` raises :class:`DeadlockError` printing it.

Some cycles are intended and proved by the mapper's schedule: a ring of PEs
each taking from the previous one and sending to the next. A :class:`Ring`
names its members in order and the rule that proves it; the check verifies
the ring against the routes, checks the rule's condition from the route
set's own numbers, and only then drops the members' task edges on the ring
colors (the other edges stay, so a ring is never a blanket exemption):

* ``message``: forwarding rings (the streamed GEMM's partial sums,
  ``docs/weight_streaming.md`` section 5): every member consumes one wavelet
  per wavelet it sends and has at most one message of ``message`` wavelets
  in flight ahead of its consumer; live when every ring link holds a whole
  message plus one wavelet: ``message <= capacity - 1``, with a link's
  capacity ``tx_depth + routers * router_depth + rx_depth`` counted along
  its route;
* ``receive_first``: rotations of blocks by blocking transfers (weight
  gradients, softmax): members that receive their whole block before
  sending cut the ring in every step; live when at least one member does.

The check covers waits for room. Waits for data (a task waiting for one
color while another color's queue fills behind it) are the schedule's
business; ``docs/faults.md`` says which couplings that leaves argued rather
than proved.
"""

from __future__ import annotations

import dataclasses

from wse.config import ROUTE_INPUT_NONE, FabricConfig, Port, UsageError, route_outputs

__all__ = ["DeadlockError", "Ring", "Proof", "check_routes", "route_graph", "load_checked"]

_RAMP = int(Port.RAMP)


class DeadlockError(UsageError):
    """A route set whose channel-dependency graph has a cycle (the message
    prints it) or whose routes lead a color nowhere."""


@dataclasses.dataclass(frozen=True)
class Ring:
    """A ring of PEs the mapper's schedule proves live (exactly one rule).

    Members
    -------
    name:
        What the ring is, for messages (``"column 3 partial sums"``).
    members:
        ``(x, y, color in, color out)`` in ring order: the ``color out``
        route from member ``k``'s PE delivers to member ``k + 1``'s PE (the
        last to the first) on its ``color in``.
    message:
        Forwarding rule: the most wavelets a member sends per step.
    receive_first:
        Rotation rule: per member, whether it takes its whole block before
        sending its own.
    """
    name: str
    members: tuple[tuple[int, int, int, int], ...]
    message: int | None = None
    receive_first: tuple[bool, ...] | None = None

    def rule(self) -> str:
        """The rule in words."""
        if self.message is not None:
            return f"forwarding, {self.message} wavelet(s) per message"
        return "rotation, receive-first members cut it"


@dataclasses.dataclass(frozen=True)
class Proof:
    """What :func:`check_routes` proved.

    Members
    -------
    what:
        The route set's name.
    channels, dependencies:
        Nodes and edges of the channel-dependency graph (after the rings).
    rings:
        ``(name, rule, bound)`` per discharged ring: for a forwarding ring
        the smallest link capacity, for a rotation the receive-first members.
    """
    what: str
    channels: int
    dependencies: int
    rings: tuple[tuple[str, str, int], ...]


def _label(node: tuple) -> str:
    """A channel in words."""
    kind = node[0]
    if kind == "R":
        return f"router ({node[1]}, {node[2]}) color {node[3]}"
    if kind == "RX":
        return f"PE ({node[1]}, {node[2]}) input queue of color {node[3]}"
    return f"PE ({node[1]}, {node[2]}) output queue"


class _Graph:
    """The route table and the channel-dependency graph built from it."""

    def __init__(self, config: FabricConfig, routes, what: str):
        self.config, self.what = config, what
        W, H = config.width, config.height
        self.table: dict[tuple[int, int, int], tuple[int, list]] = {}
        for x, y, color, inp, outputs in routes:
            x, y, color = int(x), int(y), int(color)
            if not (0 <= x < W and 0 <= y < H and 0 <= color < config.colors):
                raise DeadlockError(f"the routes of {what} name router ({x}, {y}) color {color}, outside the "
                                    f"{config.mesh} mesh with {config.colors} colors")
            code = ROUTE_INPUT_NONE if inp is None else int(Port(inp))
            self.table[(x, y, color)] = (code, route_outputs(x, y, outputs, W, H)[1])
        self.edges: dict[tuple, set] = {}

    def copy(self) -> _Graph:
        """Another graph with the same route table and a copy of the edges (to add a phase's tasks to)."""
        other = _Graph.__new__(_Graph)
        other.config, other.what, other.table = self.config, self.what, self.table
        other.edges = {node: set(targets) for node, targets in self.edges.items()}
        return other

    def add(self, a: tuple, b: tuple) -> None:
        self.edges.setdefault(a, set()).add(b)
        self.edges.setdefault(b, set())

    def route_edges(self) -> None:
        """Route edges; a route that leads its color nowhere is an error."""
        W = self.config.width
        for (x, y, c), (code, targets) in sorted(self.table.items()):
            if code == ROUTE_INPUT_NONE:
                continue
            here = ("R", x, y, c)
            self.edges.setdefault(here, set())
            if not targets:
                raise DeadlockError(f"the routes of {self.what} take color {c} into router ({x}, {y}) from "
                                    f"{Port(code).name} but send it nowhere: its wavelets would stay there")
            for port, neighbour in targets:
                if port is Port.RAMP:
                    self.add(here, ("RX", x, y, c))
                elif neighbour is not None:
                    nx, ny = neighbour % W, neighbour // W
                    their = self.table.get((nx, ny, c), (ROUTE_INPUT_NONE, []))[0]
                    if their != int(port.opposite):
                        raise DeadlockError(
                            f"the routes of {self.what} send color {c} {port.name} from router ({x}, {y}) to "
                            f"router ({nx}, {ny}), which does not take color {c} from {port.opposite.name}: "
                            f"its wavelets would wait there for ever")
                    self.add(here, ("R", nx, ny, c))

    def traffic(self) -> dict:
        """Per PE, ``(colors delivered to it, colors taken from it)`` by the routes."""
        per_pe: dict[tuple[int, int], tuple[set, set]] = {}
        for (x, y, c), (code, targets) in self.table.items():
            if code == ROUTE_INPUT_NONE:
                continue
            if code == _RAMP:
                per_pe.setdefault((x, y), (set(), set()))[1].add(c)
            if any(port is Port.RAMP for port, _ in targets):
                per_pe.setdefault((x, y), (set(), set()))[0].add(c)
        return per_pe

    def path(self, x: int, y: int, color: int) -> tuple[tuple[int, int] | None, int]:
        """Follow ``color`` from PE ``(x, y)``'s ramp along single-output routes:
        ``(PE it reaches, routers passed)``, or ``(None, n)`` if it does not reach one PE."""
        W = self.config.width
        code, targets = self.table.get((x, y, color), (ROUTE_INPUT_NONE, []))
        if code != _RAMP:
            return None, 0
        routers = 1
        while len(targets) == 1:
            port, neighbour = targets[0]
            if port is Port.RAMP:
                return ((x, y) if routers > 1 else None), routers
            if neighbour is None or routers > W * self.config.height:
                return None, routers
            x, y = neighbour % W, neighbour // W
            targets = self.table.get((x, y, color), (ROUTE_INPUT_NONE, []))[1]
            routers += 1
        return None, routers

    def cycle(self) -> list | None:
        """A cycle of the graph as a list of nodes (first repeated last), or None.

        The search visits nodes in sorted order, so the cycle named is the same
        from run to run; a graph without one is first proved so in any order
        (no sorting: the common case)."""
        return self._search(ordered=True) if self._search(ordered=False) else None

    def _search(self, ordered: bool) -> list | None:
        """Depth-first search for a cycle, roots and children in sorted order if ``ordered``."""
        order = _ordered if ordered else iter
        state: dict[tuple, int] = {}
        for root in (sorted(self.edges) if ordered else self.edges):
            if root in state:
                continue
            stack = [(root, order(self.edges[root]))]
            state[root] = 1
            path = [root]
            while stack:
                node, children = stack[-1]
                child = next(children, None)
                if child is None:
                    stack.pop()
                    path.pop()
                    state[node] = 2
                elif state.get(child) == 1:
                    return path[path.index(child):] + [child]
                elif child not in state:
                    state[child] = 1
                    path.append(child)
                    stack.append((child, order(self.edges[child])))
        return None


def _ordered(nodes: set):
    """An iterator over ``nodes`` in sorted order (a set of one needs no sort)."""
    return iter(nodes) if len(nodes) < 2 else iter(sorted(nodes))


def route_graph(config: FabricConfig, routes, *, what: str) -> _Graph:
    """The route table and route edges of ``routes``, checked (raises
    :class:`DeadlockError` naming ``what`` for a route that leads a color
    nowhere): pass it as :func:`check_routes`' ``graph`` to check several
    task sets (such as the phases of one program) on one route set without
    building it again; each check works on a copy."""
    graph = _Graph(config, routes, what)
    graph.route_edges()
    return graph


def _ring(graph: _Graph, ring: Ring) -> tuple[str | None, int]:
    """Check ``ring`` against the routes and its rule: ``(None, bound)`` when it
    is proved, else ``(why not, 0)``."""
    cfg, n = graph.config, len(ring.members)
    if n < 2:
        return f"ring {ring.name} has fewer than two members", 0
    if (ring.message is None) == (ring.receive_first is None):
        return f"ring {ring.name} must give exactly one rule", 0
    capacities = []
    for k, (x, y, _, c_out) in enumerate(ring.members):
        nx, ny, c_in, _ = ring.members[(k + 1) % n]
        reached, routers = graph.path(x, y, c_out)
        if reached != (nx, ny) or c_in != c_out:
            return (f"ring {ring.name}: color {c_out} from PE ({x}, {y}) does not reach PE ({nx}, {ny}) "
                    f"on color {c_in}"), 0
        capacities.append(cfg.tx_depth + routers * cfg.router_depth + cfg.rx_depth)
    if ring.message is not None:
        capacity = min(capacities)
        if ring.message > capacity - 1:
            return (f"ring {ring.name} sends messages of {ring.message} wavelets but its smallest link holds "
                    f"{capacity} (tx_depth + routers * router_depth + rx_depth), so at most {capacity - 1} "
                    f"are live"), 0
        return None, capacity
    if len(ring.receive_first) != n:
        return f"ring {ring.name} gives {len(ring.receive_first)} receive_first flags for {n} members", 0
    cuts = sum(bool(flag) for flag in ring.receive_first)
    if not cuts:
        return f"ring {ring.name} has no member that receives first, so every member may wait on its send", 0
    return None, cuts


def check_routes(config: FabricConfig, routes, *, what: str, traffic: dict | None = None,
                 rings=(), graph: _Graph | None = None) -> Proof:
    """Prove that ``routes`` cannot deadlock its buffers, or raise.

    Parameters
    ----------
    config : FabricConfig
        The fabric (mesh, colors and the queue depths).
    routes : iterable of (x, y, color, input, outputs)
        The route table entries, as ``load_routes`` takes them (a later entry
        for the same router and color replaces an earlier one).
    what : str
        The route set's name, for messages.
    traffic : dict, optional
        ``{(x, y): (colors received, colors sent)}``: what the PEs' tasks take
        from and give to the fabric (the mapper's knowledge, e.g. of one
        phase). Default: every color the routes deliver to or take from each PE.
    rings : iterable of Ring
        The cycles the schedule proves live.
    graph : optional
        :func:`route_graph` of the same ``config`` and ``routes``, built once
        for several checks (``routes`` is then not read again); the same proof.

    Returns
    -------
    Proof

    Raises
    ------
    DeadlockError
        Naming the cycle of channels (and why a ring on it is not proved), or
        a route that leads a color nowhere.
    """
    graph = route_graph(config, routes, what=what) if graph is None else graph.copy()
    if traffic is None:
        traffic = graph.traffic()
    discharged, failed, proved, why = set(), set(), [], []
    for ring in rings:
        reason, bound = _ring(graph, ring)
        edges = {(x, y, c_in) for x, y, c_in, _ in ring.members}
        if reason is None:
            discharged |= edges
            proved.append((ring.name, ring.rule(), bound))
        else:
            failed |= edges
            why.append(reason)
    discharged -= failed    # an edge on two rings is dropped only if both are proved
    for (x, y), (receives, sends) in sorted(traffic.items()):
        sent = [c for c in sorted(sends) if graph.table.get((x, y, c), (None,))[0] == _RAMP]
        for c in sent:
            graph.add(("TX", x, y), ("R", x, y, c))
        if not sends:
            continue
        for c in sorted(receives):
            if ("RX", x, y, c) in graph.edges and (x, y, c) not in discharged:
                graph.add(("RX", x, y, c), ("TX", x, y))
    cycle = graph.cycle()
    if cycle is not None:
        note = f" ({'; '.join(why)})" if why else ""
        raise DeadlockError(f"the routes of {what} can deadlock: a cycle of channels each waiting for room in the "
                            f"next: {' -> '.join(_label(node) for node in cycle)}{note}")
    return Proof(what, len(graph.edges), sum(len(v) for v in graph.edges.values()), tuple(proved))


def load_checked(device, config: FabricConfig, routes, what: str, **kwargs) -> Proof:
    """:func:`check_routes`, then ``device.load_routes(routes)``: a route set
    that can deadlock is never loaded."""
    routes = list(routes)
    proof = check_routes(config, routes, what=what, **kwargs)
    remapped = getattr(device, "check_remapped", None)
    if remapped is not None:        # a logical mesh on a defective one (wse.sim.defects): its physical routes too
        remapped(routes, what=what, **kwargs)
    device.load_routes(routes)
    return proof
