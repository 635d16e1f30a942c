// A whole forward pass through the real Metal host code on the mock device
// (tests/test_metal_mock.py builds this with csrc/ and tests/metal_mock/).
//
//   metal_forward MODEL.gguf [CHOICE=VALUE ...]      prints, per line: "<name> max_abs_diff <d> scale <s> splits <n>"
//
// The Metal session and a CPU session evaluate the same 20-token prompt (every
// position's logits) and three decode steps (fixed tokens 3, 200, 64); the line reports the
// largest logit difference, the logits' scale and the decode plan's split
// count.  CHOICE=VALUE forces a kernel choice (force_kernel, e.g. metal.attention=flash);
// MINFER_CPU_OPS (set by the test) moves ops to the CPU;
// METAL_FORWARD_DUMP / METAL_FORWARD_CPU_DUMP=path write each session's logits there.
//
// METAL_FORWARD_BATCH=path instead runs a Metal BatchRunner (batch_steps below) and writes its logits there.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <map>
#include <string>

#include "backends/kernel_choice.h"
#include "engine/batch.h"
#include "engine/session.h"

using namespace minfer;

// Two sequences through a Metal BatchRunner: a ragged prompt step (8 and 5 tokens, blocks of 16: the first
// sequence in blocks 3 and 0, the second in block 1), then one decode token each.  Writes the four last-row
// logits rows (prompt A, prompt B, decode A, decode B) to `path`, the decode rows' 5 best (step_best) to
// path + ".best"; prints the placement ("placement OP=BACKENDS ...") and "batch ok".
int batch_steps(std::shared_ptr<Model> model, const char* path) {
    SchedulerOptions o;
    o.device = "metal";
    o.n_ctx = 64;
    o.n_threads = 1;
    BatchRunner runner(model, o, 256, 16);
    const int V = model->config().n_vocab, mb = runner.max_blocks();
    std::vector<int32_t> tables(size_t(2) * mb, 0);
    tables[0] = 3;
    tables[size_t(mb)] = 1;
    const std::vector<int32_t> prompt = {1, 17, 42, 5, 99, 23, 7, 8, /* B: */ 9, 10, 11, 12, 13};
    const std::vector<int32_t> pos = {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4};
    const int32_t lens[2] = {8, 5};
    std::vector<float> out(size_t(4) * V);
    runner.step(prompt.data(), pos.data(), lens, 2, tables.data(), nullptr, out.data());
    const int32_t dec[2] = {3, 200}, dpos[2] = {8, 5}, ones[2] = {1, 1};
    runner.step(dec, dpos, ones, 2, tables.data(), nullptr, out.data() + size_t(2) * V);
    if (FILE* f = std::fopen(path, "wb")) {
        std::fwrite(out.data(), 4, out.size(), f);
        std::fclose(f);
    }
    // The decode step again (it rewrites the same KV rows), each row's 5 best read where the logits are (a
    // sampled step's read-back): their values, then their ids, to path + ".best".
    std::vector<float> vals(10);
    std::vector<int32_t> ids(10);
    runner.step_best(dec, dpos, ones, 2, tables.data(), nullptr, 5, vals.data(), ids.data());
    if (FILE* f = std::fopen((std::string(path) + ".best").c_str(), "wb")) {
        std::fwrite(vals.data(), 4, vals.size(), f);
        std::fwrite(ids.data(), 4, ids.size(), f);
        std::fclose(f);
    }
    std::printf("placement");
    for (const auto& [op, names] : runner.placement()) {
        std::printf(" %s=", op.c_str());
        const char* sep = "";
        for (const std::string& n : names) std::printf("%s%s", sep, n.c_str()), sep = ",";
    }
    std::printf("\nbatch ok\n");
    return 0;
}

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    try {
        for (int i = 2; i < argc; i++) {
            const std::string arg = argv[i];
            const size_t eq = arg.find('=');
            force_kernel(arg.substr(0, eq), eq == std::string::npos ? "" : arg.substr(eq + 1));
        }
        auto model = Model::load(argv[1]);
        if (const char* path = std::getenv("METAL_FORWARD_BATCH")) return batch_steps(model, path);
        const int V = model->config().n_vocab;
        SessionOptions mo, co;
        mo.device = "metal";
        co.device = "cpu";
        mo.n_ctx = co.n_ctx = 1024;  // two KV splits: decode takes attention_split
        mo.n_threads = co.n_threads = 1;
        if (const char* f = std::getenv("METAL_FORWARD_FUSE")) mo.fuse = std::atoi(f) != 0;
        Session metal(model, mo), cpu(model, co);
        if (metal.device() != "metal") {
            std::printf("error: session runs on %s\n", metal.device().c_str());
            return 1;
        }
        // 20 tokens: the prompt takes the simdgroup-matrix matmul and prefill-attention kernels
        std::vector<int32_t> prompt = {1, 17, 42, 5, 99, 23, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 19, 20, 21};
        const int n = int(prompt.size());
        std::vector<float> a(size_t(n) * V), b(size_t(n) * V);
        metal.eval(prompt.data(), n, 0, true, a.data());
        cpu.eval(prompt.data(), n, 0, true, b.data());
        const int decode[3] = {3, 200, 64};  // fixed, so an independent reference can follow
        int tok = 0;
        for (int step = 0; step < 3; step++) {
            tok = decode[step];
            std::vector<float> x(static_cast<size_t>(V)), y(static_cast<size_t>(V));
            metal.eval(&tok, 1, n + step, false, x.data());
            cpu.eval(&tok, 1, n + step, false, y.data());
            a.insert(a.end(), x.begin(), x.end());
            b.insert(b.end(), y.begin(), y.end());
        }
        double d = 0, s = 0;
        for (size_t i = 0; i < a.size(); i++) {
            d = std::fmax(d, std::fabs(double(a[i]) - b[i]));
            s = std::fmax(s, std::fabs(double(b[i])));
        }
        auto dump = [](const char* var, const std::vector<float>& v) {  // logits, raw f32
            if (const char* path = std::getenv(var))
                if (FILE* f = std::fopen(path, "wb")) {
                    std::fwrite(v.data(), 4, v.size(), f);
                    std::fclose(f);
                }
        };
        dump("METAL_FORWARD_DUMP", a);
        dump("METAL_FORWARD_CPU_DUMP", b);
        {  // greedy on the device must be the argmax of the logits
            std::vector<float> z(static_cast<size_t>(V));
            int t2 = 11;
            metal.eval(&t2, 1, n + 3, false, z.data());
            int best = 0;
            for (int i = 1; i < V; i++)
                if (z[size_t(i)] > z[size_t(best)]) best = i;
            if (metal.eval_greedy(&t2, 1, n + 3) != best) {
                std::printf("error: eval_greedy %d, argmax of eval %d\n", metal.eval_greedy(&t2, 1, n + 3), best);
                return 1;
            }
        }
        std::map<std::string, int> ops;  // the decode graph's ops, as the fusion pass left them
        for (const Node& node : metal.plan(1, false).graph().nodes) ops[op_name(node.op)]++;
        std::printf("ops");
        for (const auto& [op, count] : ops) std::printf(" %s=%d", op.c_str(), count);
        std::printf("\nmax_abs_diff %.6g scale %.6g splits %zu greedy %d\n", d, s, metal.plan(1, false).splits().size(),
                    metal.eval_greedy(&tok, 1, n + 3));
        return 0;
    } catch (const std::exception& e) {
        std::printf("error: %s\n", e.what());
        return 1;
    }
}
