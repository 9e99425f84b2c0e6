#include "server/measure.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "kernels/v_layout.h"

namespace rvd {
namespace {

using rvd::v1::MeasureHeader;
using rvd::v1::Measurement;
using rvd::v1::TensorSpec;

absl::Status WithTensor(const TensorSpec& spec, const absl::Status& s) {
  return absl::Status(
      s.code(), absl::StrCat("tensor '", spec.name(), "' (layer ", spec.layer(),
                             "): ", s.message()));
}

bool IsSet(const std::atomic<bool>* cancel) {
  return cancel != nullptr && cancel->load();
}

absl::Status Cancelled() {
  return absl::CancelledError(
      "the request was cancelled (client gone, deadline passed or rvd "
      "shutting down) during the computation; the result was not recorded");
}

double GeometricMean(const std::vector<double>& values) {
  double log_sum = 0;
  for (double v : values) log_sum += std::log(v);
  return std::exp(log_sum / values.size());
}

}  // namespace

absl::StatusOr<DType> ToDType(rvd::v1::DType dtype) {
  switch (dtype) {
    case rvd::v1::DTYPE_F32:
      return DType::kF32;
    case rvd::v1::DTYPE_F16:
      return DType::kF16;
    case rvd::v1::DTYPE_BF16:
      return DType::kBF16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown dtype ", static_cast<int>(dtype),
                       " (expected f32, f16 or bf16)"));
  }
}

// ToVLayout casts: the proto's and the engine's VLayout must number every
// layout alike, and neither may have one the other lacks.
#define RVD_SAME_LAYOUT(proto, engine) \
  static_assert(rvd::v1::proto == static_cast<int>(VLayout::engine))
RVD_SAME_LAYOUT(V_LAYOUT_SEPARATE, kSeparate);
RVD_SAME_LAYOUT(V_LAYOUT_PHI3_QKV, kPhi3Qkv);
RVD_SAME_LAYOUT(V_LAYOUT_GPT_NEOX_QKV, kGptNeoxQkv);
RVD_SAME_LAYOUT(V_LAYOUT_FALCON_MULTI_QUERY, kFalconMultiQuery);
RVD_SAME_LAYOUT(V_LAYOUT_FALCON_GROUPED, kFalconGrouped);
RVD_SAME_LAYOUT(V_LAYOUT_FALCON_CLASSIC, kFalconClassic);
RVD_SAME_LAYOUT(V_LAYOUT_GPT2_CONV1D, kGpt2Conv1D);
#undef RVD_SAME_LAYOUT
static_assert(rvd::v1::VLayout_MAX == std::size(kAllVLayouts) &&
                  rvd::v1::V_LAYOUT_GPT2_CONV1D == rvd::v1::VLayout_MAX,
              "a layout was added to one VLayout enum and not the other");

absl::StatusOr<VLayout> ToVLayout(rvd::v1::VLayout layout) {
  if (layout < rvd::v1::V_LAYOUT_SEPARATE ||
      layout > rvd::v1::V_LAYOUT_GPT2_CONV1D) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown V layout ", static_cast<int>(layout)));
  }
  return static_cast<VLayout>(layout);
}

absl::Status ValidateModelId(const std::string& model_id) {
  bool ok = !model_id.empty() && model_id.size() <= 128 &&
            std::all_of(model_id.begin(), model_id.end(), [](char c) {
              return std::isalnum(static_cast<unsigned char>(c)) || c == '_' ||
                     c == '.' || c == ':' || c == '-';
            });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("invalid model_id '", model_id.substr(0, 160),
                   "': must match [A-Za-z0-9_.:-]{1,128}"));
}

absl::StatusOr<uint64_t> TensorByteSize(const TensorSpec& spec) {
  absl::StatusOr<DType> dtype = ToDType(spec.dtype());
  if (!dtype.ok()) return WithTensor(spec, dtype.status());
  if (absl::StatusOr<VLayout> l = ToVLayout(spec.layout()); !l.ok()) {
    return WithTensor(spec, l.status());
  }
  if (spec.shape_size() != 2 || spec.shape(0) <= 0 || spec.shape(1) <= 0) {
    return WithTensor(spec, absl::InvalidArgumentError(absl::StrCat(
                                "shape must be 2-D and positive, got [",
                                absl::StrJoin(spec.shape(), ", "), "]")));
  }
  // 2^40 elements per side is far beyond any weight; it keeps the product
  // from overflowing.
  constexpr int64_t kMaxDim = int64_t{1} << 40;
  if (spec.shape(0) > kMaxDim || spec.shape(1) > kMaxDim / spec.shape(0)) {
    return WithTensor(spec, absl::InvalidArgumentError("shape too large"));
  }
  return static_cast<uint64_t>(spec.shape(0) * spec.shape(1)) *
         DTypeSize(*dtype);
}

absl::StatusOr<uint64_t> ValidateHeader(const MeasureHeader& header,
                                        uint64_t max_request_bytes) {
  if (absl::Status s = ValidateModelId(header.model_id()); !s.ok()) return s;
  if (header.tensors().empty()) {
    return absl::InvalidArgumentError("request has no tensors");
  }
  if (header.tensors_size() > kMaxTensors) {
    return absl::InvalidArgumentError(
        absl::StrCat("request has ", header.tensors_size(),
                     " tensors; the limit is ", kMaxTensors, " per request"));
  }
  for (const auto* set : {&header.early_layers(), &header.late_layers()}) {
    if (set->size() > kMaxTensors) {
      return absl::InvalidArgumentError(absl::StrCat(
          set == &header.early_layers() ? "early" : "late", " layers: ",
          set->size(), " given; the limit is ", kMaxTensors));
    }
  }
  if (header.variant().probes() > kMaxProbes) {
    return absl::InvalidArgumentError(
        absl::StrCat("variant probes ", header.variant().probes(),
                     " exceeds the limit of ", kMaxProbes));
  }
  if (header.variant().sketch_rank() > kMaxSketchRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("variant sketch_rank ", header.variant().sketch_rank(),
                     " exceeds the limit of ", kMaxSketchRank));
  }
  const std::string& variant = header.variant().name();
  if (!variant.empty()) {
    const auto& known = KnownVariants();
    if (std::find(known.begin(), known.end(), variant) == known.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown variant '", variant,
                       "'; known: ", absl::StrJoin(known, ", ")));
    }
  }
  uint64_t total = 0;
  int64_t heads = 0;  // kv heads of the request
  std::set<uint32_t> layers;
  for (const TensorSpec& spec : header.tensors()) {
    if (spec.name().size() > kMaxTensorNameBytes) {
      // The name itself is not echoed: it is what is too long.
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor name of layer ", spec.layer(), " has ", spec.name().size(),
          " bytes; the limit is ", kMaxTensorNameBytes));
    }
    const rvd::v1::HeadGeometry& g = spec.geometry();
    if (g.num_heads() > kMaxHeads || g.num_kv_heads() > kMaxHeads) {
      return WithTensor(spec, absl::InvalidArgumentError(absl::StrCat(
                                  "num_heads ", g.num_heads(), ", num_kv_heads ",
                                  g.num_kv_heads(), ": the limit is ", kMaxHeads,
                                  " each")));
    }
    heads += g.num_kv_heads();
    if (heads > kMaxHeadsPerRequest) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request has more than ", kMaxHeadsPerRequest,
          " kv heads over its tensors (the limit)"));
    }
    absl::StatusOr<uint64_t> bytes = TensorByteSize(spec);
    if (!bytes.ok()) return bytes.status();
    if (!layers.insert(spec.layer()).second) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", spec.layer(),
                                                     " is sent twice (tensor '",
                                                     spec.name(), "')"));
    }
    total += *bytes;
    if (total > max_request_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("request tensors exceed the limit of ",
                       max_request_bytes, " bytes (max_request_bytes)"));
    }
  }
  // A rank of a sharded model names the group's layers, which its shards
  // need not cover (pipeline parallelism): the coordinator checks them.
  for (const auto* set : {&header.early_layers(), &header.late_layers()}) {
    for (uint32_t layer : *set) {
      if (!layers.contains(layer) && !header.has_shard_group()) {
        return absl::InvalidArgumentError(
            absl::StrCat(set == &header.early_layers() ? "early" : "late",
                         " layer ", layer, " is not among the layers sent (",
                         absl::StrJoin(layers, ","), ")"));
      }
    }
  }
  if (header.early_layers().empty() != header.late_layers().empty()) {
    return absl::InvalidArgumentError(
        "give both early and late layers, or neither for the default quarters");
  }
  return total;
}

void DefaultLayerSets(const std::vector<uint32_t>& sorted_layers,
                      std::vector<uint32_t>* early,
                      std::vector<uint32_t>* late) {
  const size_t n = sorted_layers.size();
  const size_t quarter = (n + 3) / 4;  // ceil(L/4)
  early->assign(sorted_layers.begin(), sorted_layers.begin() + quarter);
  late->assign(sorted_layers.end() - quarter, sorted_layers.end());
}

VariantSpec ResolveVariant(const MeasureHeader& header,
                           const std::string& default_variant,
                           const Engine& engine) {
  VariantSpec variant;
  variant.name = header.variant().name();
  if (variant.name.empty()) variant.name = default_variant;
  if (variant.name.empty()) variant.name = engine.DefaultVariant();
  if (header.variant().probes() > 0) variant.probes = header.variant().probes();
  if (header.variant().sketch_rank() > 0) {
    variant.sketch_rank = header.variant().sketch_rank();
  }
  variant.seed = header.variant().seed();
  return variant;
}

Measurement AssembleMeasurement(const MeasureHeader& header,
                                absl::Span<const double> pr,
                                absl::Span<const TensorResults> where,
                                const std::string& variant,
                                const Engine& engine, double elapsed_ms) {
  const int n = header.tensors_size();
  Measurement m;
  m.set_model_id(header.model_id());
  m.set_step(header.step());
  std::map<uint32_t, double> layer_pr;
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return header.tensors(a).layer() < header.tensors(b).layer();
  });
  for (int i : order) {
    const TensorSpec& spec = header.tensors(i);
    rvd::v1::LayerPR* layer = m.add_layers();
    layer->set_layer(spec.layer());
    layer->set_tensor_name(spec.name());
    layer->set_pr(pr[where[i].layer]);
    layer_pr[spec.layer()] = layer->pr();
    if (layer->pr() == 0) {
      m.add_warnings(absl::StrCat("layer ", spec.layer(), " ('", spec.name(),
                                  "'): V is all zeros, PR reported as 0"));
    }
    for (size_t h = 0; h < where[i].heads; ++h) {
      layer->add_head_pr(pr[where[i].layer + 1 + h]);
    }
  }

  std::vector<uint32_t> early(header.early_layers().begin(),
                              header.early_layers().end());
  std::vector<uint32_t> late(header.late_layers().begin(),
                             header.late_layers().end());
  if (early.empty()) {
    std::vector<uint32_t> sorted;
    for (const auto& [layer, unused] : layer_pr) sorted.push_back(layer);
    DefaultLayerSets(sorted, &early, &late);
  }
  std::vector<double> early_pr, late_pr;
  bool has_zero = false;
  for (uint32_t l : early) {
    early_pr.push_back(layer_pr[l]);
    has_zero |= layer_pr[l] == 0;
  }
  for (uint32_t l : late) {
    late_pr.push_back(layer_pr[l]);
    has_zero |= layer_pr[l] == 0;
  }
  if (has_zero) {
    m.add_warnings("R_V is absent: an early or late layer has PR 0");
  } else {
    m.set_rv(GeometricMean(late_pr) / GeometricMean(early_pr));
  }
  for (uint32_t l : early) m.add_early_layers(l);
  for (uint32_t l : late) m.add_late_layers(l);
  m.set_variant(variant);
  m.set_backend(engine.Backend());
  m.set_engine_version(engine.Version());
  m.set_elapsed_ms(elapsed_ms);
  const absl::Time now = absl::Now();
  m.mutable_timestamp()->set_seconds(absl::ToUnixSeconds(now));
  m.mutable_timestamp()->set_nanos(absl::ToUnixNanos(now) % 1000000000);
  return m;
}

absl::StatusOr<Measurement> ComputeMeasurement(
    Engine& engine, const MeasureHeader& header,
    absl::Span<const std::string_view> data,
    const std::string& default_variant, const std::atomic<bool>* cancel) {
  if (IsSet(cancel)) return Cancelled();
  const int n = header.tensors_size();
  if (static_cast<int>(data.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request has ", n, " tensor specs but ", data.size(), " data blocks"));
  }

  // Slice V out of every tensor; the views point into `data` or `slices`.
  std::vector<VSlices> slices(n);
  std::vector<MatrixView> views;
  std::vector<int> view_of_tensor(n);  // index of the layer view in `views`
  for (int i = 0; i < n; ++i) {
    const TensorSpec& spec = header.tensors(i);
    absl::StatusOr<uint64_t> bytes = TensorByteSize(spec);
    if (!bytes.ok()) return bytes.status();
    if (data[i].size() != *bytes) {
      return WithTensor(spec, absl::InvalidArgumentError(absl::StrCat(
                                  "has ", data[i].size(),
                                  " bytes, shape and dtype need ", *bytes)));
    }
    TensorView tensor{data[i].data(), spec.shape(0), spec.shape(1),
                      *ToDType(spec.dtype())};
    HeadGeometry geometry{spec.geometry().num_heads(),
                          spec.geometry().num_kv_heads(),
                          spec.geometry().head_dim()};
    absl::StatusOr<VSlices> s =
        SliceV(tensor, *ToVLayout(spec.layout()), geometry);
    if (!s.ok()) return WithTensor(spec, s.status());
    slices[i] = *std::move(s);
    view_of_tensor[i] = views.size();
    views.push_back(slices[i].layer);
    if (header.per_head()) {
      views.insert(views.end(), slices[i].heads.begin(), slices[i].heads.end());
    }
  }

  const VariantSpec variant = ResolveVariant(header, default_variant, engine);

  std::vector<double> pr(views.size());
  const auto start = std::chrono::steady_clock::now();
  CallOptions call;
  call.cancel = cancel;
  absl::Status s = engine.ComputePR(views, variant, absl::MakeSpan(pr), call);
  const double elapsed_ms = std::chrono::duration<double, std::milli>(
                                std::chrono::steady_clock::now() - start)
                                .count();
  if (IsSet(cancel)) return Cancelled();
  if (!s.ok()) {
    // The engine names a batch index; on this (rare) path find the tensor
    // by computing each layer alone, so the message names it.
    for (int i = 0; i < n; ++i) {
      double unused;
      absl::Status one = engine.ComputePR({&views[view_of_tensor[i]], 1},
                                          variant, {&unused, 1});
      if (!one.ok()) return WithTensor(header.tensors(i), one);
    }
    return s;
  }

  std::vector<TensorResults> where(n);
  for (int i = 0; i < n; ++i) {
    where[i] = TensorResults{static_cast<size_t>(view_of_tensor[i]),
                             header.per_head() ? slices[i].heads.size() : 0};
  }
  return AssembleMeasurement(header, pr, where, variant.name, engine, elapsed_ms);
}

absl::StatusOr<MeasurementLog::Entry> RecordUnlessCancelled(
    History& history, Measurement m, const std::atomic<bool>* cancel) {
  if (IsSet(cancel)) return Cancelled();
  return history.Add(std::move(m));
}

}  // namespace rvd
