// rvd_bench_cpu: the CPU engine's variants, validated then timed.
//
// Order (llm.c dev/cuda): build inputs; run every variant in KnownVariants()
// on a validation set against the float64 SVD oracle (exact variants must
// pass |got - ref| <= atol + rtol |ref|, estimates report their error);
// only then time each variant on the benchmark batch (default 64 matrices of
// 128 x 4096 f32 with a power-law spectrum), median of --reps runs, and print
// ms total, ms per matrix, GB/s of input read, GFLOP/s of the Gram and the
// engine version that served it.
//
//   build-kernels/bin/rvd_bench_cpu [--batch=64 --rows=128 --cols=4096
//       --dtype=f32|f16|bf16 --reps=9 --threads=0 --variants=... --json=FILE]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "kernels/cpu_engine_stats.h"
#include "kernels/engine.h"
#include "kernels/pr_check.h"
#include "kernels/test_matrices.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(int, batch, 64, "matrices per batch");
ABSL_FLAG(int, rows, 128, "rows per matrix");
ABSL_FLAG(int, cols, 4096, "columns per matrix");
ABSL_FLAG(std::string, dtype, "f32", "f32, f16 or bf16");
ABSL_FLAG(int, reps, 9, "timed runs per variant (median reported)");
ABSL_FLAG(int, threads, 0, "engine threads (0: one per core)");
ABSL_FLAG(std::string, variants, "algebraic,power_iter,sketch,naive",
          "variants to time, in order");
ABSL_FLAG(int, naive_reps, 1, "timed runs for the (slow) naive SVD variant");
ABSL_FLAG(uint64_t, seed, 0, "input seed (0: random)");
ABSL_FLAG(std::string, json, "", "also write the results to this JSON file");
ABSL_FLAG(int, ab_rounds, 4,
          "interleaved rounds of algebraic vs the numpy-equivalent OpenBLAS "
          "ssyrk peer (f32 only; 0: skip)");

namespace rvd {
namespace {

// Inputs from the one test-matrix generator (kernels/test_matrices.h):
// power-law spectra, stored in the benchmark's dtype.
struct Batch {
  std::vector<StoredMatrix> storage;
  std::vector<MatrixView> views;
  double bytes = 0;
};

void AddMatrix(Batch& b, std::mt19937_64& rng, int rows, int cols, DType dt) {
  b.storage.push_back(Store(MakeMatrix(rng, rows, cols, Spectrum::kPowerLaw),
                            rows, cols, dt, 0, "powerlaw"));
  b.views.push_back(b.storage.back().view);
  b.bytes += double(rows) * cols * DTypeSize(dt);
}

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dts = absl::GetFlag(FLAGS_dtype);
  DType dt;
  if (dts == "f32") {
    dt = DType::kF32;
  } else if (dts == "f16") {
    dt = DType::kF16;
  } else if (dts == "bf16") {
    dt = DType::kBF16;
  } else {
    std::fprintf(stderr, "unknown --dtype %s\n", dts.c_str());
    return 2;
  }
  const int nb = absl::GetFlag(FLAGS_batch), rows = absl::GetFlag(FLAGS_rows),
            cols = absl::GetFlag(FLAGS_cols);
  uint64_t seed = absl::GetFlag(FLAGS_seed);
  if (seed == 0) seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  std::unique_ptr<Engine> engine = NewCpuEngine(absl::GetFlag(FLAGS_threads));
  nlohmann::json report = {{"engine", engine->Version()},
                           {"backend", engine->Backend()},
                           {"batch", nb},
                           {"rows", rows},
                           {"cols", cols},
                           {"dtype", dts},
                           {"seed", seed}};

  // 1. Validate every variant against the oracle on fresh inputs: the bench
  // shape plus odd, tall and degenerate ones.
  Batch val;
  const int shapes[][2] = {{rows, cols}, {rows, cols}, {37, 129},   {300, 40},
                           {1, 512},     {512, 1},     {cols, rows}};
  for (const auto& s : shapes) AddMatrix(val, rng, s[0], s[1], dt);
  std::vector<double> ref;
  for (const MatrixView& v : val.views) ref.push_back(*OraclePR(v));
  std::printf("validation: %zu matrices (%s) against the float64 SVD oracle\n",
              val.views.size(), dts.c_str());
  bool ok = true;
  for (const std::string& name : KnownVariants()) {
    VariantSpec spec;
    spec.name = name;
    spec.seed = 1;
    std::vector<double> got(val.views.size());
    const absl::Status s =
        engine->ComputePR(val.views, spec, absl::MakeSpan(got));
    if (absl::IsUnimplemented(s)) {
      std::printf("  %-10s skipped: %s\n", name.c_str(),
                  std::string(s.message()).c_str());
      report["validation"][name] = "unimplemented";
      continue;
    }
    if (!s.ok()) {
      std::printf("  %-10s ERROR %s\n", name.c_str(), s.ToString().c_str());
      ok = false;
      continue;
    }
    const CheckResult r = CheckPR(got, ref, kExactPrTolerance);
    if (IsExactVariant(name)) {
      std::printf("  %-10s %s max rel error %.2e (tolerance rtol %.0e)\n",
                  name.c_str(), r.mismatches ? "FAIL" : "ok  ", r.max_rel_error,
                  kExactPrTolerance.rtol);
      if (r.mismatches) {
        std::printf("%s", r.report.c_str());
        ok = false;
      }
    } else {
      std::printf("  %-10s estimate, max rel error %.2e (K=%d, r=%d)\n",
                  name.c_str(), r.max_rel_error, spec.probes, spec.sketch_rank);
    }
    report["validation"][name] = {{"max_rel_error", r.max_rel_error},
                                  {"mismatches", r.mismatches}};
  }
  if (!ok) {
    std::printf("validation failed: not benchmarking\n");
    return 1;
  }

  // 2. Time each variant on the benchmark batch.
  Batch bench;
  for (int i = 0; i < nb; ++i) AddMatrix(bench, rng, rows, cols, dt);
  const double n = std::min(rows, cols), len = std::max(rows, cols);
  const double gram_flops =
      n * (n + 1) * len * nb;  // syrk: n(n+1)/2 dots of len
  std::printf(
      "\nbenchmark: %d x %dx%d %s (%.1f MB), power-law spectrum, "
      "engine %s, %d threads max\n",
      nb, rows, cols, dts.c_str(), bench.bytes / 1e6, engine->Version().c_str(),
      absl::GetFlag(FLAGS_threads));
  std::printf("  %-10s %10s %10s %12s %8s %9s %8s\n", "variant", "ms",
              "ms/matrix", "spread ms", "GB/s", "GFLOP/s", "served");
  std::vector<double> out(nb);
  const std::vector<std::string> timed =
      absl::StrSplit(absl::GetFlag(FLAGS_variants), ',', absl::SkipEmpty());
  for (const std::string& name : timed) {
    VariantSpec spec;
    spec.name = name;
    spec.seed = 7;
    const int reps = name == "naive" ? absl::GetFlag(FLAGS_naive_reps)
                                     : absl::GetFlag(FLAGS_reps);
    std::vector<double> ts;
    absl::Status s =
        engine->ComputePR(bench.views, spec, absl::MakeSpan(out));  // warm-up
    for (int r = 0; r < reps && s.ok(); ++r) {
      std::fill(out.begin(), out.end(), -1.0);  // poison
      const double t0 = NowMs();
      s = engine->ComputePR(bench.views, spec, absl::MakeSpan(out));
      ts.push_back(NowMs() - t0);
      for (double x : out) {
        if (!(x >= 1.0)) s = absl::InternalError("output not written");
      }
    }
    if (!s.ok()) {
      std::printf("  %-10s ERROR %s\n", name.c_str(), s.ToString().c_str());
      continue;
    }
    std::sort(ts.begin(), ts.end());
    const double med = ts[ts.size() / 2];
    if (name == "algebraic") {
      const CpuEngineCounters c = GetCpuEngineCounters();
      std::printf(
          "  (algebraic so far: %lld matrices on AVX-512 kernels, %lld on "
          "OpenBLAS ssyrk, %lld float64 fallbacks)\n",
          static_cast<long long>(c.avx512_grams),
          static_cast<long long>(c.openblas_grams),
          static_cast<long long>(c.float64_fallbacks));
    }
    const bool exact_gram = name == "algebraic";
    std::printf(
        "  %-10s %10.2f %10.4f %5.2f-%-6.2f %8.2f %9s %s/%s\n", name.c_str(),
        med, med / nb, ts.front(), ts.back(), bench.bytes / med / 1e6,
        exact_gram ? std::to_string(int(gram_flops / med / 1e6)).c_str() : "-",
        engine->Version().c_str(), name.c_str());
    report["timings"][name] = {{"median_ms", med},
                               {"min_ms", ts.front()},
                               {"max_ms", ts.back()},
                               {"ms_per_matrix", med / nb},
                               {"gb_per_s", bench.bytes / med / 1e6},
                               {"reps", reps},
                               {"served_by", engine->Version() + "/" + name}};
    if (exact_gram)
      report["timings"][name]["gflop_per_s"] = gram_flops / med / 1e6;
  }
  // 3. A-B against the numpy Gram path done in-process: per matrix,
  // G = W W^T with cblas_ssyrk mirrored to the full square (OpenBLAS
  // threaded, as numpy runs w @ w.T), ||W||_F^2 and ||G||_F^2 with
  // cblas_sdot (numpy's vdot). Same
  // inputs, interleaved ours-peer-ours-peer, so both see the same load.
  const int rounds = absl::GetFlag(FLAGS_ab_rounds);
  if (rounds > 0 && dt == DType::kF32) {
    const int threads =
        absl::GetFlag(FLAGS_threads) > 0
            ? absl::GetFlag(FLAGS_threads)
            : static_cast<int>(std::thread::hardware_concurrency());
    std::vector<float> g(static_cast<size_t>(n * n));
    std::vector<double> peer(nb);
    auto run_peer = [&] {
      openblas_set_num_threads(threads);
      for (int i = 0; i < nb; ++i) {
        const MatrixView& v = bench.views[i];
        const float* w = static_cast<const float*>(v.data);
        const int ni = static_cast<int>(n), li = static_cast<int>(len);
        // numpy computes w @ w.T with ssyrk (it spots the transposed
        // operand) and then mirrors the triangle.
        cblas_ssyrk(CblasRowMajor, CblasUpper,
                    v.rows <= v.cols ? CblasNoTrans : CblasTrans, ni, li, 1.0f,
                    w, static_cast<int>(v.ld), 0.0f, g.data(), ni);
        for (int r = 0; r < ni; ++r) {
          for (int c = r + 1; c < ni; ++c) g[c * ni + r] = g[r * ni + c];
        }
        const double f2 =
            cblas_sdot(static_cast<int>(v.rows * v.cols), w, 1, w, 1);
        const double g2 = cblas_sdot(ni * ni, g.data(), 1, g.data(), 1);
        peer[i] = f2 * f2 / g2;
      }
      openblas_set_num_threads(1);  // back to what the engine set
    };
    run_peer();  // warm-up
    std::vector<double> ours_ms, peer_ms, ratios;
    for (int r = 0; r < rounds; ++r) {
      std::vector<double> a, b;
      for (int rep = 0; rep < 5; ++rep) {
        double t0 = NowMs();
        (void)engine->ComputePR(bench.views, {}, absl::MakeSpan(out));
        a.push_back(NowMs() - t0);
        t0 = NowMs();
        run_peer();
        b.push_back(NowMs() - t0);
      }
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      ours_ms.push_back(a[2]);
      peer_ms.push_back(b[2]);
      ratios.push_back(b[2] / a[2]);
    }
    const CheckResult pc = CheckPR(peer, out, {0.0, 1e-4});
    std::printf(
        "\nA-B (%d rounds of 5 interleaved pairs, medians per round):\n",
        rounds);
    for (int r = 0; r < rounds; ++r) {
      std::printf(
          "  round %d: ours %.2f ms (%.4f ms/matrix), ssyrk peer %.2f ms "
          "(%.4f ms/matrix), peer/ours %.2fx\n",
          r + 1, ours_ms[r], ours_ms[r] / nb, peer_ms[r], peer_ms[r] / nb,
          ratios[r]);
    }
    std::sort(ratios.begin(), ratios.end());
    std::printf(
        "  speedup over the numpy-equivalent ssyrk path: %.2fx - %.2fx "
        "(peer PR vs ours max rel diff %.1e)\n",
        ratios.front(), ratios.back(), pc.max_rel_error);
    report["ab_vs_numpy_equivalent_peer"] = {{"ours_ms", ours_ms},
                                             {"peer_ms", peer_ms},
                                             {"speedup_min", ratios.front()},
                                             {"speedup_max", ratios.back()}};
  }
  const std::string json = absl::GetFlag(FLAGS_json);
  if (!json.empty()) std::ofstream(json) << report.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace rvd

int main(int argc, char** argv) { return rvd::Main(argc, argv); }
