// The verilator backend's engine: a W x H mesh of Verilator models of the
// RTL blocks (one wse_pe and one wse_router per tile, sim/cosim/rtl.py),
// joined as hdl/tile.py and hdl/fabric.py join them, stepped N cycles per
// call with no Python in the loop.
//
// The joining is wiring and a few registers, done here once per clock cycle
// exactly as the RTL does it (docs/rtl.md sections 1.2, 1.3, 2 and 3):
//   * tile: the PE's output link feeds the router's RAMP input and the
//     router's RAMP output feeds the PE; the PE's enable is the mesh's
//     running; the tile is idle when both are; host requests of the ROUTE
//     space go to the router's table (addresses >= 32 are ignored and read
//     0), all others to the PE;
//   * links: tile (x, y)'s router output by port p feeds the input of its
//     neighbour by the opposite port; on the boundary it is an edge port;
//     the link ECC of hdl/link_ecc.py (LINK space, armed flips, counters, an
//     uncorrectable wavelet stopping the run) is done here too (LinkEnd);
//     so are the dead parts of the DEAD space (dead_parts.h);
//   * run control: `start` zeroes cycle, hops and the arbitration start color
//     and sets running; a run cycle that begins with every tile idle and no
//     edge wavelet pending ends the run, any other counts up;
//   * host bus: one request per cycle, to the addressed tile (every tile for
//     a broadcast write); a read answers in the next cycle;
//   * edges: each run cycle, per edge port, the head of the first color in
//     rotating order (from cycle mod colors) whose ready bit is high; every
//     edge output is accepted and recorded with its cycle.
// The full RTL mesh (hdl/fabric.py with hdl/tile.py, exported as one design)
// runs under cocotb; both are checked against the golden model.
//
// Blocks whose state cannot change in a cycle are not evaluated: an idle
// router (all FIFOs empty) that receives nothing, an idle PE (no task running
// or ready, queues empty) that receives nothing and no host request. Their
// outputs stay valid: ready bits depend on state only and nothing leaves an
// empty queue.
//
// A cycle of a block is at most two model evaluations: with the clock low,
// after the inputs its outputs depend on are applied (a router's ready bits
// and the arbitration start color; a PE's ready bits, only when they changed),
// which settles what it sends; then the rising edge, after what it receives is
// applied. When the first is not needed, the model's edge detector is armed
// directly so that the rising edge alone is one evaluation.
//
// The C interface (extern "C" below) is loaded by sim/cosim/verilator.py with
// ctypes. Edge ports are numbered N[0..W-1], E[0..H-1], S[0..W-1], W[0..H-1].

#include "Vwse_pe.h"
#include "Vwse_pe___024root.h"
#include "Vwse_router.h"
#include "Vwse_router___024root.h"
#include "verilated.h"

#include "dead_parts.h"
#include "link_ecc.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

// One evaluation of a model. Model::eval() wraps the model's scheduler in
// per-call housekeeping for $display messages and dynamic objects, which
// these models do not have; where the scheduler's entry point has the name
// this Verilator gives it, call it directly (after the first eval(), which
// initializes the model), else eval().
void Vwse_pe___024root___eval(Vwse_pe___024root* vlSelf) __attribute__((weak));
void Vwse_router___024root___eval(Vwse_router___024root* vlSelf) __attribute__((weak));

static inline void evaluate(Vwse_pe* model) {
    if (Vwse_pe___024root___eval) {
        Vwse_pe___024root___eval(model->rootp);
    } else {
        model->eval();
    }
}

static inline void evaluate(Vwse_router* model) {
    if (Vwse_router___024root___eval) {
        Vwse_router___024root___eval(model->rootp);
    } else {
        model->eval();
    }
}

namespace {

// Wait for a worker hand-off: spin (a cycle of a mesh is a few microseconds),
// then yield, then sleep (between runs, while the host works).
template <typename Done>
inline void wait_until(Done&& done) {
    for (int spin = 0; !done(); ++spin) {
        if (spin < 4096) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } else if (spin < 8192) {
            std::this_thread::yield();
        } else {
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }
}

constexpr int kMeshPorts = 4;  // N, E, S, W; the router's port 4 is RAMP
constexpr int kRamp = 4;
constexpr int kOpposite[kMeshPorts] = {2, 3, 0, 1};
constexpr int kDx[kMeshPorts] = {0, 1, 0, -1};
constexpr int kDy[kMeshPorts] = {-1, 0, 1, 0};
constexpr uint32_t kRouteSpace = 3;
constexpr uint32_t kLinkSpace = 5;  // link ECC registers (hdl/link_ecc.py), address port * 8 + register
constexpr uint32_t kCtrlSpace = 4;
constexpr uint32_t kFlipAddr = 13;    // CTRL: flips a memory word (ECC_ADDRS["flip"]); its scrubs drain in idle cycles
constexpr uint32_t kFlipAtAddr = 14;  // CTRL: arms a memory flip at a run cycle (wse.hdl.pe_ecc.ECC_ADDRS["flip_at"])
constexpr double kMainShare = 0.9;  // the calling thread's part of an even share of the tiles

enum Status { kIdle = 0, kSteps = 1, kCycleLimit = 2, kNoProgress = 3, kNotRunning = 4 };

// Arm a model's rising-edge detector without a low-clock evaluation, where the
// Verilator version names it as expected; otherwise evaluate with the clock low.
template <typename R, typename = void>
struct HasEdgeMemory : std::false_type {};
template <typename R>
struct HasEdgeMemory<R, std::void_t<decltype(std::declval<R&>().__Vtrigprevexpr___TOP__clk__0)>>
    : std::true_type {};

template <typename M>
void arm_rising_edge(M* model) {
    using Root = std::remove_pointer_t<decltype(model->rootp)>;
    if constexpr (HasEdgeMemory<Root>::value) {
        model->rootp->__Vtrigprevexpr___TOP__clk__0 = 0;
    } else {
        model->clk = 0;
        evaluate(model);
    }
}

struct Record {
    uint64_t wavelet;  // 38 bits: data | color << 32 | ctrl << 37
    uint64_t cycle;
};

struct RouterOut {
    uint32_t rx_ready[5];
    uint8_t tx_valid[5];
    uint64_t tx_payload[5];
    uint8_t idle, sent;
};

struct PeOut {
    uint32_t rx_ready;
    uint8_t tx_valid;
    uint64_t tx_payload;
    uint8_t idle, work, running;
};

// What a tile sends in the current cycle, settled in the first phase; read by
// its neighbours in the second (its cached outputs change then).
struct Sends {
    bool r_active, p_active;    // the block was not idle at the start of the cycle
    uint8_t r_valid[5];
    uint64_t r_payload[5];
    uint8_t sent, p_valid, work;
    uint64_t p_payload;
};

struct Tile {
    std::unique_ptr<VerilatedContext> pe_context, router_context;  // declared first: outlive the models
    std::unique_ptr<Vwse_pe> pe;
    std::unique_ptr<Vwse_router> router;
    int index;
    int neighbour[kMeshPorts];  // tile index, or -1 on the boundary
    int edge[kMeshPorts];       // edge port on the boundary, else -1
    RouterOut r;                // outputs as of the last evaluation
    PeOut p;
    Sends s;
    bool r_low, p_low;          // evaluated with the clock low in this cycle
    uint32_t pe_ready_in;       // the PE's tx_ready input as last applied
    uint8_t edge_valid[kMeshPorts];  // injections from the host at the boundary
    uint64_t edge_payload[kMeshPorts];
    uint64_t cycle_sent;        // hops of this cycle
    bool cycle_progress;        // something moved or worked in this cycle
    LinkEnd link_in[kMeshPorts];  // the links entering by N, E, S, W (link_ecc.h)
    bool link_fault = false;    // some link_in latched an uncorrectable wavelet
    bool flip_armed = false;    // a memory flip was injected or armed: the PE is evaluated every cycle
    uint8_t dead = 0;           // the DEAD space: bit p port p dead, bit 4 the PE (dead_parts.h)
};

class Mesh {
  public:
    Mesh(int width, int height, int colors, int threads) : width_(width), height_(height), colors_(colors) {
        const int n = width * height;
        tiles_.resize(n);
        ports_ = 2 * (width + height);
        queues_.assign(ports_, std::vector<std::deque<uint64_t>>(colors));
        queued_.assign(ports_, 0);
        out_.resize(ports_);
        emits_.resize(n);
        t_evals_.assign(n, 0);
        all_colors_ = colors >= 32 ? 0xFFFFFFFFu : ((1u << colors) - 1);
        for (int y = 0; y < height; ++y) {
            for (int x = 0; x < width; ++x) {
                Tile& t = tiles_[y * width + x];
                t.index = y * width + x;
                for (int p = 0; p < kMeshPorts; ++p) t.edge_valid[p] = 0;
                t.pe_context.reset(new VerilatedContext);  // one per model: threads share nothing
                t.router_context.reset(new VerilatedContext);
                t.pe.reset(new Vwse_pe(t.pe_context.get()));
                t.router.reset(new Vwse_router(t.router_context.get()));
                for (int p = 0; p < kMeshPorts; ++p) {
                    const int nx = x + kDx[p], ny = y + kDy[p];
                    const bool inside = nx >= 0 && nx < width && ny >= 0 && ny < height;
                    t.neighbour[p] = inside ? ny * width + nx : -1;
                    t.edge[p] = inside ? -1 : edge_port(p, p == 0 || p == 2 ? x : y);
                }
            }
        }
        set_threads(threads);
        reset();
    }

    ~Mesh() {
        stop_workers();
        for (Tile& t : tiles_) {
            t.pe->final();
            t.router->final();
        }
    }

    int edge_port(int side, int index) const {
        switch (side) {
            case 0: return index;
            case 1: return width_ + index;
            case 2: return width_ + height_ + index;
            default: return 2 * width_ + height_ + index;
        }
    }

    void reset() {
        for (Tile& t : tiles_) {
            Vwse_pe* pe = t.pe.get();
            Vwse_router* router = t.router.get();
            pe->enable = 0;
            pe->host_stb = 0;
            router->route_we = 0;
            for (int cycle = 0; cycle < 2; ++cycle) {
                pe->rst = router->rst = cycle == 0;
                pe->clk = router->clk = 0;
                pe->eval();
                router->eval();
                pe->clk = router->clk = 1;
                pe->eval();
                router->eval();
            }
            t.r_low = t.p_low = false;
            for (LinkEnd& e : t.link_in) e = LinkEnd();
            t.link_fault = false;   // flip_armed stays: flipped words and pending scrubs survive a reset
            t.dead = 0;
            capture_router(t);
            t.pe_ready_in = t.r.rx_ready[kRamp];
            pe->tx_ready = t.pe_ready_in;
            pe->eval();
            capture_pe(t);
        }
        running_ = false;
        cycle_ = hops_ = 0;
        first_color_ = 0;
        for (auto& port : queues_) for (auto& q : port) q.clear();
        for (auto& q : queued_) q = 0;
        queued_total_ = 0;
    }

    // ---------------------------------------------------------------- host bus
    // ctl: addr[15:0] | space << 16 | we << 19 | bcast << 20; xy: x | y << 8.
    void host(int n, const uint32_t* ctl, const uint32_t* xy, const uint32_t* wdata, uint32_t* rdata) {
        for (int i = 0; i < n; ++i) {
            const uint32_t c = ctl[i];
            const uint32_t addr = c & 0xFFFF, space = (c >> 16) & 7;
            const bool we = (c >> 19) & 1, bcast = ((c >> 20) & 1) && we;
            const int x = xy[i] & 0xFF, y = (xy[i] >> 8) & 0xFF;
            ++host_cycles_;
            if (!bcast && !(x < width_ && y < height_)) {  // no such tile: nothing answers
                rdata[i] = 0;
                continue;
            }
            const int first = bcast ? 0 : y * width_ + x;
            const int last = bcast ? static_cast<int>(tiles_.size()) : first + 1;
            for (int k = first; k < last; ++k) {
                Tile& t = tiles_[k];
                if (space == kLinkSpace || space == kDeadSpace) {
                    const uint32_t got = space == kLinkSpace ? link_host(t, addr, we, wdata[i])
                                                             : dead_host(t.dead, addr, we, wdata[i]);
                    if (!we) rdata[i] = got;
                } else if (space == kRouteSpace) {
                    Vwse_router* router = t.router.get();
                    router->route_color = addr & 31;
                    if (we) {
                        if (addr < 32) {
                            router->route_we = 1;
                            router->route_wdata = wdata[i] & 0xFF;
                            clock_router(t);
                            router->route_we = 0;
                            capture_router(t);
                        }
                    } else {
                        router->eval();  // the table's read port is combinational
                        rdata[i] = addr < 32 ? router->route_rdata : 0;
                    }
                } else {
                    Vwse_pe* pe = t.pe.get();
                    if (we && space == kCtrlSpace && (addr == kFlipAtAddr || addr == kFlipAddr)) t.flip_armed = true;
                    pe->host_stb = 1;
                    pe->host_sel = 1;
                    pe->host_we = we;
                    pe->host_bcast = bcast;
                    pe->host_space = space;
                    pe->host_addr = addr;
                    pe->host_wdata = wdata[i];
                    clock_pe(t);
                    pe->host_stb = 0;
                    capture_pe(t);
                    if (!we) rdata[i] = pe->host_rdata;
                }
            }
            if (we) rdata[i] = 0;
        }
    }

    // The LINK space of tile t (link_ecc.h): counters and report of the link
    // entering by the port, the flip of the link leaving by it (write only).
    uint32_t link_host(Tile& t, uint32_t addr, bool we, uint32_t wdata) {
        const uint32_t port = addr >> 3, reg = addr & 7;
        if (port >= kMeshPorts) return 0;
        if (!we) return link_read(t.link_in[port], reg);
        const int nb = t.neighbour[port];
        if (link_write(t.link_in[port], nb < 0 ? nullptr : &tiles_[nb].link_in[kOpposite[port]], reg, wdata)) {
            t.link_fault = false;
            for (const LinkEnd& o : t.link_in) t.link_fault |= o.fault;
        }
        return 0;
    }

    // ---------------------------------------------------------------- edges
    void stream_in(int port, int color, int n, const uint32_t* data, const uint8_t* ctrl) {
        auto& q = queues_[port][color];
        for (int i = 0; i < n; ++i) {
            q.push_back(uint64_t(data[i]) | (uint64_t(color) << 32) | (uint64_t(ctrl[i] & 1) << 37));
        }
        queued_[port] += n;
        queued_total_ += n;
    }

    int64_t queued(int port, int color) const { return static_cast<int64_t>(queues_[port][color].size()); }
    int64_t out_count(int port) const { return static_cast<int64_t>(out_[port].size()); }
    int64_t out_take(int port, int64_t n, uint64_t* wavelets, uint64_t* cycles) { return take(out_[port], n, wavelets, cycles); }
    int64_t emit_count(int tile) const { return static_cast<int64_t>(emits_[tile].size()); }
    int64_t emit_take(int tile, int64_t n, uint64_t* wavelets, uint64_t* cycles) { return take(emits_[tile], n, wavelets, cycles); }

    // ---------------------------------------------------------------- run control
    void start() {
        // The start cycle: PEs are not enabled yet and nothing moves between
        // runs; at its end running rises and cycle, hops and the color are 0.
        ++host_cycles_;
        running_ = true;
        cycle_ = hops_ = 0;
        first_color_ = 0;
        run_cycle_ = 0;
        quiet_ = 0;
        for (Tile& t : tiles_) t.pe->enable = !dead_link(t.dead, kRamp);
    }

    int step(int64_t max_steps, int64_t max_cycles, int64_t window) {
        if (!running_) return kNotRunning;
        for (int64_t s = 0; s < max_steps; ++s) {
            if (run_cycle_ >= static_cast<uint64_t>(max_cycles)) return kCycleLimit;
            const bool progress = run_one_cycle();
            if (!running_) return kIdle;
            quiet_ = progress ? 0 : quiet_ + 1;
            if (window > 0 && quiet_ >= static_cast<uint64_t>(window)) return kNoProgress;
        }
        return kSteps;
    }

    // ---------------------------------------------------------------- probes
    void regs(int tile, uint32_t* out) {
        Vwse_pe* pe = tiles_[tile].pe.get();
        for (int r = 0; r < 16; ++r) {
            pe->probe_reg_sel = r;
            pe->eval();  // combinational: the clock does not change
            out[r] = pe->probe_reg;
        }
    }

    int state(int tile) const {
        const Tile& t = tiles_[tile];
        return t.p.tx_valid | t.p.running << 1 | t.p.work << 2 | (t.p.idle && t.r.idle) << 3;
    }

    void set_trace(bool on) { trace_ = on; }
    void set_threads(int threads);

    uint64_t cycle() const { return cycle_; }
    uint64_t hops() const { return hops_; }
    bool running() const { return running_; }
    uint64_t run_cycles() const { return run_cycles_; }
    uint64_t host_cycles() const { return host_cycles_; }
    uint64_t evals() const {
        uint64_t total = 0;
        for (uint64_t n : t_evals_) total += n;
        return total;
    }

  private:
    static int64_t take(std::deque<Record>& q, int64_t n, uint64_t* wavelets, uint64_t* cycles) {
        const int64_t k = std::min<int64_t>(n, q.size());
        for (int64_t i = 0; i < k; ++i) {
            wavelets[i] = q[i].wavelet;
            cycles[i] = q[i].cycle;
        }
        q.erase(q.begin(), q.begin() + k);
        return k;
    }

    // One rising edge of a block, after a low-clock evaluation or an armed detector.
    void clock_router(Tile& t) {
        if (!t.r_low) arm_rising_edge(t.router.get());
        t.router->clk = 1;
        evaluate(t.router.get());
        t.r_low = false;
    }

    void clock_pe(Tile& t) {
        if (!t.p_low) arm_rising_edge(t.pe.get());
        t.pe->clk = 1;
        evaluate(t.pe.get());
        t.p_low = false;
    }

    void capture_router_sends(Tile& t) {
        Vwse_router* m = t.router.get();
        RouterOut& o = t.r;
        o.tx_valid[0] = m->tx_0_valid;
        o.tx_valid[1] = m->tx_1_valid;
        o.tx_valid[2] = m->tx_2_valid;
        o.tx_valid[3] = m->tx_3_valid;
        o.tx_valid[4] = m->tx_4_valid;
        o.tx_payload[0] = m->tx_0_payload;
        o.tx_payload[1] = m->tx_1_payload;
        o.tx_payload[2] = m->tx_2_payload;
        o.tx_payload[3] = m->tx_3_payload;
        o.tx_payload[4] = m->tx_4_payload;
        o.sent = m->sent;
    }

    void capture_router(Tile& t) {
        Vwse_router* m = t.router.get();
        RouterOut& o = t.r;
        o.rx_ready[0] = m->rx_0_ready;
        o.rx_ready[1] = m->rx_1_ready;
        o.rx_ready[2] = m->rx_2_ready;
        o.rx_ready[3] = m->rx_3_ready;
        o.rx_ready[4] = m->rx_4_ready;
        o.idle = m->idle;
        capture_router_sends(t);
    }

    void capture_pe_sends(Tile& t) {
        Vwse_pe* m = t.pe.get();
        t.p.tx_valid = m->tx_valid;
        t.p.tx_payload = m->tx_payload;
    }

    void capture_pe(Tile& t) {
        Vwse_pe* m = t.pe.get();
        PeOut& o = t.p;
        o.rx_ready = m->rx_ready;
        o.idle = m->idle;
        o.work = m->probe_work;
        o.running = m->probe_running;
        capture_pe_sends(t);
    }

    // The PE's tx_ready input is the router's RAMP ready; returns whether it changed.
    bool apply_pe_ready(Tile& t) {
        const uint32_t ready = dead_link(t.dead, kRamp) ? 0 : t.r.rx_ready[kRamp];
        if (ready == t.pe_ready_in) return false;
        t.pe->tx_ready = ready;
        t.pe_ready_in = ready;
        return true;
    }

    // Phase A: settle what each block sends from its start-of-cycle inputs.
    void settle(Tile& t) {
        Sends& s = t.s;
        s.r_active = !t.r.idle;
        if (s.r_active) {
            Vwse_router* m = t.router.get();
            uint32_t ready[kMeshPorts];
            for (int p = 0; p < kMeshPorts; ++p) {
                const int nb = t.neighbour[p];
                ready[p] = dead_link(t.dead, p) ? 0 : nb < 0 ? all_colors_
                         : dead_link(tiles_[nb].dead, kOpposite[p]) ? 0 : tiles_[nb].r.rx_ready[kOpposite[p]];
            }
            m->tx_0_ready = ready[0];
            m->tx_1_ready = ready[1];
            m->tx_2_ready = ready[2];
            m->tx_3_ready = ready[3];
            m->tx_4_ready = dead_link(t.dead, kRamp) ? 0 : t.p.rx_ready;
            m->first_color = first_color_;
            m->clk = 0;
            evaluate(m);
            t.r_low = true;
            ++t_evals_[t.index];
            capture_router_sends(t);
            for (int p = 0; p < 5; ++p) {
                s.r_valid[p] = t.r.tx_valid[p];
                s.r_payload[p] = t.r.tx_payload[p];
            }
            s.sent = t.r.sent;
        }
        s.p_active = !t.p.idle || t.flip_armed;
        if (s.p_active) {
            if (apply_pe_ready(t)) {
                Vwse_pe* m = t.pe.get();
                m->clk = 0;
                evaluate(m);
                t.p_low = true;
                ++t_evals_[t.index];
                capture_pe_sends(t);
            }
            s.p_valid = t.p.tx_valid;
            s.p_payload = t.p.tx_payload;
            s.work = t.p.work;
        }
    }

    // Phase B: gather what each block receives (its neighbours' sends of this
    // cycle, the host's injections) and clock it.
    void commit(Tile& t, uint64_t cycle) {
        const Sends& s = t.s;
        uint8_t in_valid[5];
        uint64_t in_payload[5];
        bool receives = false;
        for (int p = 0; p < kMeshPorts; ++p) {
            const int nb = t.neighbour[p];
            if (nb >= 0) {
                const Sends& from = tiles_[nb].s;
                in_valid[p] = from.r_active && from.r_valid[kOpposite[p]] && !dead_link(t.dead, p) &&
                              !dead_link(tiles_[nb].dead, kOpposite[p]);
                in_payload[p] = from.r_payload[kOpposite[p]];
                if (in_valid[p] && t.link_in[p].armed && link_cross(t.link_in[p], cycle, in_valid[p], in_payload[p])) {
                    t.link_fault = true;  // an uncorrectable wavelet: the run stops
                }
            } else {
                in_valid[p] = t.edge_valid[p];
                in_payload[p] = t.edge_payload[p];
            }
            receives |= in_valid[p] != 0;
        }
        const bool pe_sends = s.p_active && s.p_valid && !dead_link(t.dead, kRamp);
        in_valid[kRamp] = pe_sends;
        in_payload[kRamp] = s.p_payload;
        receives |= pe_sends;
        if (pe_sends && trace_) emits_[t.index].push_back({s.p_payload, cycle});
        const bool router_delivers = s.r_active && s.r_valid[kRamp] && !dead_link(t.dead, kRamp);
        t.cycle_sent = s.r_active ? s.sent : 0;
        t.cycle_progress = pe_sends || (s.p_active && s.work) || t.cycle_sent;

        if (s.p_active || router_delivers) {
            Vwse_pe* m = t.pe.get();
            m->clock = static_cast<uint32_t>(cycle);
            m->rx_valid = router_delivers;
            m->rx_payload = s.r_payload[kRamp];
            clock_pe(t);
            ++t_evals_[t.index];
            m->rx_valid = 0;
            capture_pe(t);
        }
        if (s.r_active || receives) {
            Vwse_router* m = t.router.get();
            m->rx_0_valid = in_valid[0];
            m->rx_1_valid = in_valid[1];
            m->rx_2_valid = in_valid[2];
            m->rx_3_valid = in_valid[3];
            m->rx_4_valid = in_valid[4];
            m->rx_0_payload = in_payload[0];
            m->rx_1_payload = in_payload[1];
            m->rx_2_payload = in_payload[2];
            m->rx_3_payload = in_payload[3];
            m->rx_4_payload = in_payload[4];
            clock_router(t);
            ++t_evals_[t.index];
            m->rx_0_valid = m->rx_1_valid = m->rx_2_valid = m->rx_3_valid = m->rx_4_valid = 0;
            capture_router(t);
        }
    }

    bool run_one_cycle() {
        const uint64_t t = run_cycle_;
        bool all_idle = true, link_fault = false;
        for (const Tile& tile : tiles_) {
            all_idle &= tile.r.idle && tile.p.idle;
            link_fault |= tile.link_fault;
        }
        const bool pending = queued_total_ > 0;

        parallel([this](Tile& tile) { settle(tile); });

        // The edges: outputs of this cycle, injections (spec 3.6).
        bool progress = false;
        for (int side = 0; side < kMeshPorts; ++side) {
            const int count = side == 0 || side == 2 ? width_ : height_;
            for (int index = 0; index < count; ++index) {
                const int x = side == 1 ? width_ - 1 : side == 3 ? 0 : index;
                const int y = side == 0 ? 0 : side == 2 ? height_ - 1 : index;
                Tile& tile = tiles_[y * width_ + x];
                const int port = tile.edge[side];
                if (tile.s.r_active && tile.s.r_valid[side]) out_[port].push_back({tile.s.r_payload[side], t});
                tile.edge_valid[side] = 0;
                if (queued_[port] == 0) continue;
                const uint32_t ready = dead_link(tile.dead, side) ? 0 : tile.r.rx_ready[side];
                for (int k = 0; k < colors_; ++k) {
                    const int c = (first_color_ + k) % colors_;
                    auto& q = queues_[port][c];
                    if (!q.empty() && ((ready >> c) & 1)) {
                        tile.edge_valid[side] = 1;
                        tile.edge_payload[side] = q.front();
                        q.pop_front();
                        --queued_[port];
                        --queued_total_;
                        progress = true;
                        break;
                    }
                }
            }
        }

        parallel([this, t](Tile& tile) { commit(tile, t); });

        uint64_t sent = 0;
        for (const Tile& tile : tiles_) {
            sent += tile.cycle_sent;
            progress |= tile.cycle_progress;
        }
        hops_ += sent;
        ++run_cycle_;
        ++run_cycles_;
        if ((all_idle && !pending) || link_fault) {  // an uncorrectable wavelet stops the run
            running_ = false;
            for (Tile& tile : tiles_) tile.pe->enable = 0;
        } else {
            ++cycle_;
            first_color_ = first_color_ + 1 == colors_ ? 0 : first_color_ + 1;
        }
        return progress;
    }

    // ---------------------------------------------------------------- threads
    template <typename F>
    void parallel(F&& f) {
        if (workers_.empty()) {
            for (Tile& t : tiles_) f(t);
            return;
        }
        job_ = [&f](Tile& t) { f(t); };
        done_.store(0, std::memory_order_relaxed);
        generation_.fetch_add(1, std::memory_order_release);
        run_share(0);
        const int workers = static_cast<int>(workers_.size());
        wait_until([&] { return done_.load(std::memory_order_acquire) == workers; });
    }

    // Share k of the tiles: contiguous rows; the calling thread (share 0), which
    // also does the serial work between the phases, takes a little less.
    size_t share_start(int share) const {
        if (share == 0) return 0;
        const double n = static_cast<double>(tiles_.size()), parts = static_cast<double>(workers_.size() + 1);
        const double first = n / parts * kMainShare;
        return static_cast<size_t>(first + (n - first) * (share - 1) / (parts - 1) + 0.5);
    }

    void run_share(int share) {
        const size_t begin = share_start(share);
        const size_t end = share == static_cast<int>(workers_.size()) ? tiles_.size() : share_start(share + 1);
        for (size_t i = begin; i < end; ++i) job_(tiles_[i]);
    }

    void worker(int share) {
        unsigned seen = generation_.load(std::memory_order_acquire);
        while (true) {
            wait_until([&] {
                return generation_.load(std::memory_order_acquire) != seen || stopping_.load(std::memory_order_relaxed);
            });
            if (stopping_.load(std::memory_order_relaxed)) return;
            seen = generation_.load(std::memory_order_acquire);
            run_share(share);
            done_.fetch_add(1, std::memory_order_acq_rel);
        }
    }

    void stop_workers() {
        stopping_.store(true);
        for (auto& w : workers_) w.join();
        workers_.clear();
        stopping_.store(false);
    }

    int width_, height_, colors_, ports_;
    uint32_t all_colors_;
    std::vector<Tile> tiles_;
    std::vector<std::vector<std::deque<uint64_t>>> queues_;
    std::vector<int64_t> queued_;
    int64_t queued_total_ = 0;
    std::vector<std::deque<Record>> out_;
    std::vector<std::deque<Record>> emits_;
    bool running_ = false, trace_ = false;
    uint64_t cycle_ = 0, hops_ = 0, run_cycle_ = 0, run_cycles_ = 0, quiet_ = 0;
    uint64_t host_cycles_ = 0;
    std::vector<uint64_t> t_evals_;  // model evaluations per tile (each thread counts its own)
    int first_color_ = 0;
    std::vector<std::thread> workers_;
    std::function<void(Tile&)> job_;
    std::atomic<unsigned> generation_{0};
    std::atomic<int> done_{0};
    std::atomic<bool> stopping_{false};
};

void Mesh::set_threads(int threads) {
    stop_workers();
    for (int share = 1; share < threads; ++share) workers_.emplace_back([this, share] { worker(share); });
}

}  // namespace

extern "C" {

void* wse_new(int width, int height, int colors, int threads) {
    return new Mesh(width, height, colors, threads < 1 ? 1 : threads);
}
void wse_free(void* mesh) { delete static_cast<Mesh*>(mesh); }
void wse_reset(void* mesh) { static_cast<Mesh*>(mesh)->reset(); }
void wse_host(void* mesh, int n, const uint32_t* ctl, const uint32_t* xy, const uint32_t* wdata, uint32_t* rdata) {
    static_cast<Mesh*>(mesh)->host(n, ctl, xy, wdata, rdata);
}
void wse_stream_in(void* mesh, int port, int color, int n, const uint32_t* data, const uint8_t* ctrl) {
    static_cast<Mesh*>(mesh)->stream_in(port, color, n, data, ctrl);
}
int64_t wse_queued(void* mesh, int port, int color) { return static_cast<Mesh*>(mesh)->queued(port, color); }
void wse_start(void* mesh) { static_cast<Mesh*>(mesh)->start(); }
int wse_step(void* mesh, int64_t max_steps, int64_t max_cycles, int64_t window) {
    return static_cast<Mesh*>(mesh)->step(max_steps, max_cycles, window);
}
int64_t wse_out_count(void* mesh, int port) { return static_cast<Mesh*>(mesh)->out_count(port); }
int64_t wse_out_take(void* mesh, int port, int64_t n, uint64_t* wavelets, uint64_t* cycles) {
    return static_cast<Mesh*>(mesh)->out_take(port, n, wavelets, cycles);
}
int64_t wse_emit_count(void* mesh, int tile) { return static_cast<Mesh*>(mesh)->emit_count(tile); }
int64_t wse_emit_take(void* mesh, int tile, int64_t n, uint64_t* wavelets, uint64_t* cycles) {
    return static_cast<Mesh*>(mesh)->emit_take(tile, n, wavelets, cycles);
}
void wse_set_trace(void* mesh, int on) { static_cast<Mesh*>(mesh)->set_trace(on != 0); }
void wse_set_threads(void* mesh, int threads) { static_cast<Mesh*>(mesh)->set_threads(threads < 1 ? 1 : threads); }
void wse_regs(void* mesh, int tile, uint32_t* out) { static_cast<Mesh*>(mesh)->regs(tile, out); }
int wse_state(void* mesh, int tile) { return static_cast<Mesh*>(mesh)->state(tile); }
uint64_t wse_cycle(void* mesh) { return static_cast<Mesh*>(mesh)->cycle(); }
uint64_t wse_hops(void* mesh) { return static_cast<Mesh*>(mesh)->hops(); }
int wse_running(void* mesh) { return static_cast<Mesh*>(mesh)->running(); }
uint64_t wse_run_cycles(void* mesh) { return static_cast<Mesh*>(mesh)->run_cycles(); }
uint64_t wse_host_cycles(void* mesh) { return static_cast<Mesh*>(mesh)->host_cycles(); }
uint64_t wse_evals(void* mesh) { return static_cast<Mesh*>(mesh)->evals(); }

}  // extern "C"
