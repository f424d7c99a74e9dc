// Evaluates a combinational Verilator model (prefix Vdut) over a file of
// operand pairs, with no Python in the loop.
//
// usage: fpu_tb OP IN OUT
//   OP   value driven on the model's `op` input for the whole run
//   IN   little-endian uint32 pairs: a0 b0 a1 b1 ...
//   OUT  written with one little-endian uint32 `result` per pair
//
// Prints one JSON line on stdout: {"evals": N, "seconds": S}, where S times
// the evaluation loop alone (no file I/O).

#include "Vdut.h"
#include "verilated.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

static std::vector<uint32_t> read_words(const char* path) {
    std::vector<uint32_t> words;
    FILE* file = std::fopen(path, "rb");
    if (!file) {
        std::fprintf(stderr, "fpu_tb: cannot open %s\n", path);
        std::exit(2);
    }
    std::fseek(file, 0, SEEK_END);
    long size = std::ftell(file);
    std::fseek(file, 0, SEEK_SET);
    if (size < 0 || size % 8 != 0) {
        std::fprintf(stderr, "fpu_tb: %s must hold whole uint32 pairs\n", path);
        std::exit(2);
    }
    words.resize(static_cast<size_t>(size) / 4);
    if (!words.empty() && std::fread(words.data(), 4, words.size(), file) != words.size()) {
        std::fprintf(stderr, "fpu_tb: short read from %s\n", path);
        std::exit(2);
    }
    std::fclose(file);
    return words;
}

int main(int argc, char** argv) {
    if (argc != 4) {
        std::fprintf(stderr, "usage: fpu_tb OP IN OUT\n");
        return 2;
    }
    const uint32_t op = static_cast<uint32_t>(std::strtoul(argv[1], nullptr, 0));
    const std::vector<uint32_t> operands = read_words(argv[2]);
    const size_t count = operands.size() / 2;
    std::vector<uint32_t> results(count);

    auto context = std::make_unique<VerilatedContext>();
    auto dut = std::make_unique<Vdut>(context.get());
    dut->op = op;

    const auto start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < count; ++i) {
        dut->a = operands[2 * i];
        dut->b = operands[2 * i + 1];
        dut->eval();
        results[i] = dut->result;
    }
    const auto stop = std::chrono::steady_clock::now();
    dut->final();

    FILE* out = std::fopen(argv[3], "wb");
    if (!out || (count && std::fwrite(results.data(), 4, count, out) != count)) {
        std::fprintf(stderr, "fpu_tb: cannot write %s\n", argv[3]);
        return 2;
    }
    std::fclose(out);
    const double seconds = std::chrono::duration<double>(stop - start).count();
    std::printf("{\"evals\": %zu, \"seconds\": %.6f}\n", count, seconds);
    return 0;
}
