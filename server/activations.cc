#include "server/activations.h"

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/measure.h"

namespace rvd {
namespace {

using rvd::v1::ActivationTensor;
using rvd::v1::MeasureActivationsRequest;
using rvd::v1::MeasureActivationsResponse;

// (measure.cc has the same conversion for weights.)
absl::StatusOr<DType> ActivationDType(rvd::v1::DType dtype) {
  switch (dtype) {
    case rvd::v1::DTYPE_F32:
      return DType::kF32;
    case rvd::v1::DTYPE_F16:
      return DType::kF16;
    case rvd::v1::DTYPE_BF16:
      return DType::kBF16;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown dtype ", static_cast<int>(dtype), " (expected f32, f16 or bf16)"));
  }
}

absl::Status WithActivation(int i, const ActivationTensor& a, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("activations[", i, "] (layer ", a.layer(),
                                             "): ", s.message()));
}

// The byte size the shape and dtype imply, after checking them.
absl::StatusOr<uint64_t> ActivationBytes(const ActivationTensor& a) {
  absl::StatusOr<DType> dtype = ActivationDType(a.dtype());
  if (!dtype.ok()) return dtype.status();
  if (a.shape_size() != 2 || a.shape(0) <= 0 || a.shape(1) <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape must be 2-D and positive (tokens x features), got [",
        absl::StrJoin(a.shape(), ", "), "]"));
  }
  const int64_t rows = a.shape(0), cols = a.shape(1);
  if (std::min(rows, cols) > kMaxActivationSide) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape [", rows, ", ", cols, "]: the smaller side exceeds the limit of ",
        kMaxActivationSide, " (its Gram is held whole)"));
  }
  // The smaller side is <= 2^12, so the product overflows only for a larger
  // side beyond 2^50: far beyond any message.
  if (std::max(rows, cols) > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError("shape too large");
  }
  return static_cast<uint64_t>(rows * cols) * DTypeSize(*dtype);
}

// The activation's bytes as the engine reads them: in place when aligned to
// the element size, else copied into `copy` (a protobuf string's bytes
// carry no alignment promise).
MatrixView ViewOf(const ActivationTensor& a, std::unique_ptr<float[]>* copy) {
  const DType dtype = *ActivationDType(a.dtype());
  const void* data = a.data().data();
  if (reinterpret_cast<uintptr_t>(data) % DTypeSize(dtype) != 0) {
    copy->reset(new float[(a.data().size() + sizeof(float) - 1) / sizeof(float)]);
    std::memcpy(copy->get(), a.data().data(), a.data().size());
    data = copy->get();
  }
  return MatrixView{data, a.shape(0), a.shape(1), a.shape(1), dtype};
}

}  // namespace

absl::StatusOr<SpectrumStats> StatsFromGramEigenvalues(absl::Span<const double> eigenvalues,
                                                       int64_t long_side) {
  if (long_side < 1) {
    return absl::InvalidArgumentError(absl::StrCat("long side ", long_side, " < 1"));
  }
  double top = 0;
  for (double x : eigenvalues) {
    if (!std::isfinite(x)) {
      return absl::InvalidArgumentError("an eigenvalue is NaN or infinite");
    }
    top = std::max(top, x);
  }
  SpectrumStats st;
  const double floor = static_cast<double>(long_side) * DBL_EPSILON * top;
  // Scaled by the largest, so that no square or sum can overflow or
  // underflow: lambda / top in (floor / top, 1], s / s_1 = sqrt of that.
  double sum_l = 0, sum_l2 = 0, sum_s = 0;
  for (double x : eigenvalues) {
    if (!(x > floor)) continue;
    const double l = x / top;
    sum_l += l;
    sum_l2 += l * l;
    sum_s += std::sqrt(l);
  }
  if (sum_l == 0) return st;  // no eigenvalue above the floor: a zero matrix
  // H = -sum p log p with p = r / S (r = s / s_1, S = sum r):
  //   = log S - (1 / S) sum r log r.
  double sum_rlogr = 0;
  for (double x : eigenvalues) {
    if (!(x > floor)) continue;
    const double r = std::sqrt(x / top);
    sum_rlogr += r * std::log(r);
  }
  st.frobenius_norm = std::sqrt(top) * std::sqrt(sum_l);
  st.max_singular_value = std::sqrt(top);
  st.entropy = std::max(0.0, std::log(sum_s) - sum_rlogr / sum_s);
  st.effective_rank = std::exp(st.entropy);
  st.participation_ratio = sum_l * sum_l / sum_l2;
  return st;
}

absl::StatusOr<uint64_t> ValidateActivations(const MeasureActivationsRequest& request,
                                             uint64_t max_request_bytes) {
  if (absl::Status s = ValidateModelId(request.model_id()); !s.ok()) return s;
  const int n = request.activations_size();
  if (n == 0) return absl::InvalidArgumentError("request has no activations");
  if (n > kMaxActivationTensors) {
    return absl::InvalidArgumentError(absl::StrCat("request has ", n,
                                                   " activations; the limit is ",
                                                   kMaxActivationTensors, " per request"));
  }
  std::set<uint32_t> layers;
  uint64_t total = 0;
  for (int i = 0; i < n; ++i) {
    const ActivationTensor& a = request.activations(i);
    if (!layers.insert(a.layer()).second) {
      return WithActivation(i, a, absl::InvalidArgumentError(
                                      "layer sent twice (one activation per layer)"));
    }
    absl::StatusOr<uint64_t> bytes = ActivationBytes(a);
    if (!bytes.ok()) return WithActivation(i, a, bytes.status());
    if (a.data().size() != *bytes) {
      return WithActivation(
          i, a, absl::InvalidArgumentError(absl::StrCat(
                    a.data().size(), " bytes do not hold a [", a.shape(0), ", ", a.shape(1),
                    "] ", DTypeName(*ActivationDType(a.dtype())), " matrix (", *bytes, " bytes)")));
    }
    total += *bytes;
  }
  if (total > max_request_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "activations of ", total, " bytes exceed max_request_bytes (", max_request_bytes, ")"));
  }
  return total;
}

absl::StatusOr<MeasureActivationsResponse> ComputeActivationStats(
    Engine& engine, const MeasureActivationsRequest& request, const std::atomic<bool>* cancel) {
  const auto start = std::chrono::steady_clock::now();
  MeasureActivationsResponse response;
  response.set_model_id(request.model_id());
  response.set_step(request.step());
  response.set_backend(engine.Backend());
  CallOptions call;
  call.cancel = cancel;
  std::vector<double> eigenvalues;
  for (int i = 0; i < request.activations_size(); ++i) {
    const ActivationTensor& a = request.activations(i);
    std::unique_ptr<float[]> copy;
    const MatrixView view = ViewOf(a, &copy);
    eigenvalues.assign(static_cast<size_t>(std::min(view.rows, view.cols)), 0.0);
    if (absl::Status s = engine.GramEigenvalues(view, absl::MakeSpan(eigenvalues), call);
        !s.ok()) {
      return WithActivation(i, a, s);
    }
    absl::StatusOr<SpectrumStats> st =
        StatsFromGramEigenvalues(eigenvalues, std::max(view.rows, view.cols));
    if (!st.ok()) return WithActivation(i, a, st.status());
    rvd::v1::ActivationStats* out = response.add_stats();
    out->set_layer(a.layer());
    out->set_effective_rank(st->effective_rank);
    out->set_frobenius_norm(st->frobenius_norm);
    out->set_max_singular_value(st->max_singular_value);
    out->set_entropy(st->entropy);
    out->set_participation_ratio(st->participation_ratio);
  }
  // A flag set after the last engine call still answers CANCELLED: no
  // result of a cancelled request is handed on.
  if (cancel != nullptr && cancel->load()) {
    return absl::CancelledError(
        "the request was cancelled (client gone, deadline passed or rvd shutting down) "
        "during the computation");
  }
  response.set_elapsed_ms(
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
          .count());
  return response;
}

}  // namespace rvd
