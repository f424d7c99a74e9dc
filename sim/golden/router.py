"""The golden router (``docs/architecture.md`` section 3): the rules of :mod:`wse.hdl.router`, cycle for cycle.

A route per color (the one input port the color is accepted from, and an
output port mask), one FIFO per color ``router_depth`` deep, ``ready`` bits
from the FIFO counts at the start of the cycle, and every cycle a grant set
built in rotating color order with atomic multicast. The rules are written
once, in :class:`Routers`, and seen two ways:

* :class:`Routers`: every router of a mesh, for the golden fabric
  (:class:`wse.sim.golden.Fabric`). The tables and FIFOs are lists, and the
  busy routers are stepped together once per cycle: :meth:`Routers.grants`
  from the start-of-cycle state, then :meth:`Routers.apply` at the end of the
  cycle. Outputs lead to the neighbour routers, to the PE's input queues
  (RAMP) and off the mesh (collected by edge port, section 3.6); the edge
  ports' injections and the PEs' output queues feed the routers' inputs.
* :class:`Router`: one router with the call shape of the RTL block
  (:class:`wse.hdl.router.Router`): route-table writes and reads, the
  ``ready`` bits of its input links, and one :meth:`Router.step` per clock
  cycle taking what the input links offer and the output links' ``ready``
  bits. It is a :class:`Routers` of one router whose outputs are all links
  to the outside; the RTL router's testbenches use it as their reference.
"""

from __future__ import annotations

from collections import deque

from wse.config import FabricConfig, Port, ROUTE_INPUT_NONE, pack_wavelet, route_outputs, unpack_wavelet

from . import ecc

__all__ = ["PORTS", "TO_ROUTER", "TO_PE", "TO_EDGE", "TO_LINK", "Routers", "Router"]

#: Router ports, in :class:`wse.config.Port` order (N, E, S, W, RAMP).
PORTS = len(Port)

#: Kinds of route targets: a neighbour router, the tile's PE (RAMP), the mesh
#: edge (always ready; collected by the host), a link to the outside whose
#: ``ready`` bits are given every cycle (:class:`Router`).
TO_ROUTER, TO_PE, TO_EDGE, TO_LINK = range(4)
#: The "port the target must accept from" of a target behind a dead link or a
#: dead PE: no route accepts from it, so nothing is ever granted to it.
DEAD = -1

_RAMP = int(Port.RAMP)
_EDGE_PORTS = {"N": Port.N, "E": Port.E, "S": Port.S, "W": Port.W}


class Routers:
    """The routers of a ``config.width x config.height`` mesh, wavelet by wavelet.

    Parameters
    ----------
    config : FabricConfig
        ``width``, ``height``, ``colors``, ``router_depth`` and ``rx_depth``.
    rx : list, optional
        Per router, the per-color input queues (deques of ``(data, ctrl)``) of
        its PE: RAMP outputs append to them, and a queue holding ``rx_depth``
        wavelets at the start of the cycle is not ready.
    tx : list, optional
        Per router, its PE's output queue (a deque of ``(data, color,
        ctrl)``), whose head the router takes through its RAMP input.

    Attributes
    ----------
    fifo : list
        ``fifo[r][c]``: the FIFO of color ``c`` at router ``r`` (row-major
        index), a deque of ``(data, ctrl)``.
    route_in, route_mask : list
        ``[r][c]``: the input port code (``ROUTE_INPUT_NONE``: not routed)
        and the output port mask of each route.
    route_targets : list
        ``[r][c]``: a tuple of ``(port, kind, target, port the target must
        accept from)`` per output port, ``kind`` one of :data:`TO_ROUTER`
        (``target`` a router), :data:`TO_PE` (a PE), :data:`TO_EDGE`
        (``target`` the ``(edge, index, color)`` key of ``edge_out``) and
        :data:`TO_LINK` (``target`` the port).
    busy : list
        ``busy[r]``: the colors whose FIFO at ``r`` holds wavelets.
    active : set
        The routers with a busy color.
    edge_in : dict
        ``{(edge, index): {color: deque of (data, ctrl)}}`` still to inject.
    edge_out : dict
        ``{(edge, index, color): [(data, ctrl), ...]}``: wavelets that left the
        mesh, in order.
    link_ready : list
        Per port, the ``ready`` bits of the :data:`TO_LINK` outputs in this cycle.
    link_out : list
        Per port, ``(color, (data, ctrl))`` sent on a :data:`TO_LINK` output
        by the last :meth:`apply`, or None.
    hops : int
        Wavelet copies sent (one per output port used).
    """

    def __init__(self, config: FabricConfig, rx: list | None = None, tx: list | None = None):
        W, H, C = config.width, config.height, config.colors
        n = W * H
        self.width, self.height, self.colors = W, H, C
        self.depth, self.rx_depth = config.router_depth, config.rx_depth
        self.rx, self.tx = rx, tx
        self.fifo = [[deque() for _ in range(C)] for _ in range(n)]
        self.route_in = [[ROUTE_INPUT_NONE] * C for _ in range(n)]
        self.route_mask = [[0] * C for _ in range(n)]
        self.route_targets: list[list[tuple]] = [[()] * C for _ in range(n)]
        self.busy = [set() for _ in range(n)]
        self.active: set[int] = set()
        self.edge_in: dict[tuple[str, int], dict[int, deque]] = {}
        self.edge_out: dict[tuple[str, int, int], list] = {}
        self._edge_router: dict[tuple[str, int], tuple[int, int]] = {}
        self.link_ready = [0] * PORTS
        self.link_out: list = [None] * PORTS
        self.hops = 0
        #: Dead parts (docs/faults.md): ``(router, port code)`` of each dead link's
        #: two ends, and the routers whose PE is dead.
        self.dead_links: set[tuple[int, int]] = set()
        self.dead_pes: set[int] = set()
        #: Link ECC (docs/architecture.md 3.7): armed flips ``{(router, port code):
        #: (cycle, wavelet mask, check mask)}`` of the links between routers, the
        #: current cycle while one is armed, and the corrected and detected counts
        #: ``{(router, port code): n}`` of the link leaving ``router`` by ``port``.
        self.link_flips: dict[tuple[int, int], tuple[int, int, int]] = {}
        self.now = 0
        self.link_ecc: dict[str, dict[tuple[int, int], int]] = {"corrected": {}, "detected": {}}

    # ------------------------------------------------------------------ route tables
    def set_route(self, x: int, y: int, color: int, input: Port | int | None, outputs) -> None:
        """Route ``color`` at router ``(x, y)`` of the mesh: accepted from ``input``
        (None: not routed), sent to every port in ``outputs`` (arguments checked by the caller)."""
        r = y * self.width + x
        in_code = ROUTE_INPUT_NONE if input is None else int(Port(input))
        mask, outs = route_outputs(x, y, outputs, self.width, self.height)
        targets = []
        for port, neighbour in outs:
            if port is Port.RAMP:
                targets.append((port, TO_PE, r, None))
            elif neighbour is not None:
                targets.append((port, TO_ROUTER, neighbour, int(port.opposite)))
            else:
                index = x if port in (Port.N, Port.S) else y
                targets.append((port, TO_EDGE, (port.name, index, color), None))
        self.set_targets(r, color, in_code, mask, tuple(targets))

    def set_targets(self, r: int, color: int, in_code: int, mask: int, targets: tuple) -> None:
        """Set the route of ``color`` at router ``r``: input port code, output mask and targets
        (a target behind a dead link or PE never takes a wavelet)."""
        if self.dead_links or self.dead_pes:
            targets = tuple(self._deaden(r, t) for t in targets)
        self.route_in[r][color] = in_code
        self.route_mask[r][color] = mask
        self.route_targets[r][color] = targets

    def _deaden(self, r: int, target: tuple) -> tuple:
        port, kind, tgt, _ = target
        if (kind == TO_ROUTER and (r, int(port)) in self.dead_links) or (kind == TO_PE and tgt in self.dead_pes):
            return (port, TO_ROUTER, tgt, DEAD)
        return target

    def kill(self, links=(), pes=()) -> None:
        """Mark links (``(router, port code)`` of both ends) and PEs (their
        router) dead; every route already set stops sending into them."""
        self.dead_links.update(links)
        self.dead_pes.update(pes)
        for r, targets in enumerate(self.route_targets):
            for c, t in enumerate(targets):
                if t:
                    self.set_targets(r, c, self.route_in[r][c], self.route_mask[r][c], t)

    def route(self, r: int, color: int) -> tuple[int, tuple[Port, ...]]:
        """The route of ``color`` at router ``r``: (input code, output ports)."""
        return self.route_in[r][color], tuple(t[0] for t in self.route_targets[r][color])

    # ------------------------------------------------------------------ inputs
    def accepts(self, r: int, color: int, port: int) -> bool:
        """``ready[color]`` of the link entering router ``r`` through ``port``:
        the color's route comes from ``port`` and its FIFO has room (spec 3.3)."""
        return self.route_in[r][color] == port and len(self.fifo[r][color]) < self.depth

    def ready_bits(self, r: int, port: int) -> int:
        """The ``ready`` bits of the link entering router ``r`` through ``port``."""
        return sum(1 << c for c in range(self.colors) if self.accepts(r, c, port))

    def push(self, r: int, color: int, wavelet: tuple) -> None:
        """Put ``(data, ctrl)`` into the FIFO of ``color`` at router ``r`` (end of the cycle)."""
        self.fifo[r][color].append(wavelet)
        self.busy[r].add(color)
        self.active.add(r)

    def edge_port(self, edge: str, index: int) -> tuple[int, int]:
        """(boundary router, port code) of edge port ``(edge, index)``."""
        x, y = {"N": (index, 0), "S": (index, self.height - 1),
                "W": (0, index), "E": (self.width - 1, index)}[edge]
        return y * self.width + x, int(_EDGE_PORTS[edge])

    def queue_edge(self, edge: str, index: int, color: int, wavelets) -> None:
        """Queue ``(data, ctrl)`` pairs for injection at edge port ``(edge, index)`` on ``color``."""
        key = (edge, index)
        self._edge_router[key] = self.edge_port(edge, index)
        self.edge_in.setdefault(key, {}).setdefault(color, deque()).extend(wavelets)

    def injections(self, first: int) -> list[tuple]:
        """This cycle's edge injections ``(port key, router, color)``: per edge port,
        the first color in rotating order whose head the boundary router accepts (spec 3.6)."""
        injections = []
        if self.edge_in:
            ncolors, depth, route_in, fifo = self.colors, self.depth, self.route_in, self.fifo
            for key, queues in self.edge_in.items():
                r, port = self._edge_router[key]
                for c in sorted(queues, key=lambda c: (c - first) % ncolors):
                    if route_in[r][c] == port and len(fifo[r][c]) < depth:
                        injections.append((key, r, c))
                        break
        return injections

    def inject(self, injections: list[tuple]) -> None:
        """End of the cycle: move the chosen edge-port heads into their FIFOs."""
        edge_in = self.edge_in
        for key, r, color in injections:
            queues = edge_in[key]
            self.push(r, color, queues[color].popleft())
            if not queues[color]:
                del queues[color]
                if not queues:
                    del edge_in[key]

    def from_ramp(self, senders) -> list[int]:
        """The routers among ``senders`` (PEs with output wavelets) whose RAMP
        input takes the head of their PE's output queue this cycle."""
        tx, route_in, fifo, depth = self.tx, self.route_in, self.fifo, self.depth
        moves = []
        for idx in senders:
            data, color, ctrl = tx[idx][0]
            if route_in[idx][color] == _RAMP and len(fifo[idx][color]) < depth:
                moves.append(idx)
        return moves

    def take_from_ramp(self, moves: list[int], senders: set) -> None:
        """End of the cycle: move the output-queue heads of ``moves`` into
        their FIFOs; PEs whose queue empties leave ``senders``."""
        tx = self.tx
        for idx in moves:
            data, color, ctrl = tx[idx].popleft()
            self.push(idx, color, (data, ctrl))
            if not tx[idx]:
                senders.discard(idx)

    # ------------------------------------------------------------------ arbitration
    def grants(self, first: int) -> list[tuple[int, int]]:
        """This cycle's grants ``(router, color)`` of every busy router, from the
        state at the start of the cycle (spec 3.4).

        Colors are visited in rotating order from ``first``; a color is granted
        when its FIFO holds a wavelet, its route has outputs, no earlier color
        was granted one of them, and every output is ready for it (multicast is
        all copies or none)."""
        grants = []
        if not self.active:
            return grants
        ncolors, depth, rx_depth = self.colors, self.depth, self.rx_depth
        route_in, route_mask, route_targets = self.route_in, self.route_mask, self.route_targets
        fifo, busy_colors, rx, link_ready = self.fifo, self.busy, self.rx, self.link_ready
        for r in self.active:
            busy = busy_colors[r]
            order = busy if len(busy) == 1 else sorted(busy, key=lambda c: (c - first) % ncolors)
            used = 0
            for c in order:
                mask = route_mask[r][c]
                if not mask or mask & used:
                    continue
                for port, kind, tgt, opp in route_targets[r][c]:
                    if kind == TO_ROUTER:
                        if route_in[tgt][c] != opp or len(fifo[tgt][c]) >= depth:
                            break
                    elif kind == TO_PE:
                        if len(rx[tgt][c]) >= rx_depth:
                            break
                    elif kind == TO_LINK:
                        if not link_ready[tgt] >> c & 1:
                            break
                else:
                    used |= mask
                    grants.append((r, c))
        return grants

    def apply(self, grants: list[tuple[int, int]]) -> list[int]:
        """End of the cycle: pop every granted head and send a copy on each
        output of its route. Returns the PEs whose input queue got a wavelet."""
        pushed_rx = []
        fifo, busy_colors, active, route_targets = self.fifo, self.busy, self.active, self.route_targets
        flips = self.link_flips
        hops = 0
        for r, c in grants:
            q = fifo[r][c]
            wavelet = q.popleft()
            if not q:
                busy_colors[r].discard(c)
            for port, kind, tgt, opp in route_targets[r][c]:
                hops += 1
                if kind == TO_ROUTER:
                    fifo[tgt][c].append(self._cross(r, port, c, wavelet) if flips and (r, port) in flips
                                        else wavelet)
                    busy_colors[tgt].add(c)
                    active.add(tgt)
                elif kind == TO_PE:
                    self.rx[tgt][c].append(wavelet)
                    pushed_rx.append(tgt)
                elif kind == TO_EDGE:
                    self.edge_out.setdefault(tgt, []).append(wavelet)
                else:
                    self.link_out[tgt] = (c, wavelet)
        self.hops += hops
        return pushed_rx

    def _cross(self, r: int, port: int, color: int, wavelet: tuple) -> tuple:
        """A wavelet crossing the armed link leaving ``r`` by ``port``: from
        the flip's cycle on, the first one is encoded, flipped, decoded and
        corrected at the receiver (counted), or stops the run."""
        at, word_mask, check_mask = self.link_flips[(r, port)]
        if self.now < at:
            return wavelet
        del self.link_flips[(r, port)]
        data, ctrl = wavelet
        word = data | color << 32 | ctrl << 37
        received, check = word ^ word_mask, ecc.wavelet_check(word) ^ check_mask
        fixed, status, syndrome = ecc.wavelet_decode(received, check)
        key = (r, int(port))
        if status == ecc.DETECTED:
            self.link_ecc["detected"][key] = self.link_ecc["detected"].get(key, 0) + 1
            x, y = r % self.width, r // self.width
            dx, dy = Port(port).delta
            raise ecc.LinkEccError(ecc.link_report(x, y, Port(port).name, x + dx, y + dy, self.now, received, check,
                                                   syndrome))
        self.link_ecc["corrected"][key] = self.link_ecc["corrected"].get(key, 0) + 1
        return fixed & 0xFFFFFFFF, fixed >> 37 & 1

    def retire(self) -> None:
        """Forget the routers whose FIFOs are all empty."""
        busy, active = self.busy, self.active
        for r in [r for r in active if not busy[r]]:
            active.discard(r)

    # ------------------------------------------------------------------ reports
    def stuck(self) -> list[str]:
        """What holds wavelets and why it cannot send them: busy routers, then edge ports."""
        lines = []
        for r, busy in enumerate(self.busy):
            x, y = r % self.width, r // self.width
            for c in sorted(busy):
                blocked = []
                if not self.route_mask[r][c]:
                    blocked.append("the route has no outputs")
                for port, kind, tgt, opp in self.route_targets[r][c]:
                    if kind == TO_ROUTER:
                        tx, ty = tgt % self.width, tgt // self.width
                        if opp == DEAD:
                            blocked.append(f"{port.name} -> PE ({tx}, {ty}) is dead" if tgt == r and port is Port.RAMP
                                           else f"{port.name} -> the link to router ({tx}, {ty}) is dead")
                        elif self.route_in[tgt][c] != opp:
                            blocked.append(f"{port.name} -> router ({tx}, {ty}) does not accept color {c} "
                                           f"from {Port(opp).name}")
                        elif len(self.fifo[tgt][c]) >= self.depth:
                            blocked.append(f"{port.name} -> router ({tx}, {ty}) is full")
                    elif kind == TO_PE and len(self.rx[tgt][c]) >= self.rx_depth:
                        blocked.append("RAMP -> PE input queue full")
                lines.append(f"router ({x}, {y}) color {c}: {len(self.fifo[r][c])} wavelet(s) stuck"
                             + (f" ({'; '.join(blocked)})" if blocked else ""))
        for (edge, index), queues in self.edge_in.items():
            for color, q in sorted(queues.items()):
                lines.append(f"edge {edge}{index}: {len(q)} wavelet(s) of color {color} not injected "
                             f"(the boundary router does not accept color {color} from {edge}, or it is full)")
        return lines


class Router:
    """One router with the call shape of :class:`wse.hdl.router.Router`.

    Every clock cycle, read :meth:`ready` (the ``rx[p].ready`` bits, from the
    state at the start of the cycle), then call :meth:`step` with what each
    input link offers, the ``ready`` bits of each output link and
    ``first_color``: it returns what each output link carries in the cycle
    (``tx[p].valid`` and ``payload``) and applies the clock edge.

    Parameters
    ----------
    config : FabricConfig
        ``colors`` and ``router_depth`` size the router.

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`FabricConfig`.
    """

    def __init__(self, config: FabricConfig):
        if not isinstance(config, FabricConfig):
            raise TypeError(f"config must be a FabricConfig, not {config!r}")
        self.config = config
        self.colors = config.colors
        self._routers = Routers(config.with_mesh(1, 1))
        #: Wavelets that left in the last :meth:`step` (router hops).
        self.sent = 0

    # ------------------------------------------------------------------ route port
    def write_route(self, color: int, word: int) -> None:
        """A route-table write (``route.we``): ``word`` is ``input[2:0] |
        outputs[7:3]``; colors ``>= config.colors`` are ignored."""
        if 0 <= color < self.colors:
            mask = (word >> 3) & ((1 << PORTS) - 1)
            targets = tuple((Port(p), TO_LINK, p, None) for p in range(PORTS) if mask >> p & 1)
            self._routers.set_targets(0, color, word & 0b111, mask, targets)

    def read_route(self, color: int) -> int:
        """The route-table word of ``color`` (``route.rdata``; 0 for colors out of range)."""
        if not 0 <= color < self.colors:
            return 0
        return self._routers.route_in[0][color] | self._routers.route_mask[0][color] << 3

    def set_route(self, color: int, input: Port | int | None, outputs) -> None:
        """Route ``color``: accepted from ``input`` (None: not routed), sent to every port in ``outputs``."""
        code = ROUTE_INPUT_NONE if input is None else int(Port(input))
        mask = 0
        for port in outputs:
            mask |= 1 << int(Port(port))
        self.write_route(color, code | mask << 3)

    def route(self, color: int) -> tuple[int, tuple[Port, ...]]:
        """The route of ``color``: (input code, output ports in port order)."""
        return self._routers.route(0, color)

    # ------------------------------------------------------------------ links
    def ready(self) -> list[int]:
        """Per input port, its ``ready`` bits: bit ``c`` when color ``c`` is
        routed from the port and its FIFO has room at the start of the cycle."""
        return [self._routers.ready_bits(0, p) for p in range(PORTS)]

    @property
    def idle(self) -> bool:
        """Every FIFO is empty."""
        return not self._routers.active

    def step(self, first_color: int, rx, tx_ready) -> list[int | None]:
        """One clock cycle.

        Parameters
        ----------
        first_color : int
            The color visited first by this cycle's arbitration (below ``colors``).
        rx : sequence
            Per input port, the packed wavelet it offers (``valid`` high), or None.
            A wavelet moves only if its color's ``ready`` bit is high.
        tx_ready : sequence of int
            Per output port, its ``ready`` bits in this cycle.

        Returns
        -------
        list
            Per output port, the packed wavelet leaving by it, or None.
        """
        routers = self._routers
        ready = self.ready()
        routers.link_ready = [int(bits) for bits in tx_ready]
        routers.link_out = [None] * PORTS
        routers.apply(routers.grants(first_color))
        outputs = [None if out is None else pack_wavelet(out[1][0], out[0], out[1][1]) for out in routers.link_out]
        for p, word in enumerate(rx):
            if word is not None:
                data, color, ctrl = unpack_wavelet(word)
                if color < self.colors and ready[p] >> color & 1:
                    routers.push(0, color, (data, ctrl))
        routers.retire()
        self.sent = sum(word is not None for word in outputs)
        return outputs
