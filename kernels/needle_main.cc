// kvpool-needle: the synthetic needle-in-a-haystack test over context lengths x needle depths,
// run through the CPU kernels (scores, selection), printed as JSON for bench/needle_heatmap.py.
//
// For every method, context length and depth it plants a needle (synthetic.h), selects with the
// method at `--budget` (a fraction of the context), and reports the fraction of (layer, kv_head)
// pairs that kept the needle token: 1 = retained everywhere, 0 = lost.
//
// Usage: kvpool-needle [--budget 0.1] [--lengths 512,1024,...] [--depths 11] [--layers 4]

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/compress.h"
#include "kernels/synthetic.h"

namespace kvpool {
namespace kernels {
namespace {

int Main(int argc, char** argv) {
  double budget = 0.1;
  std::vector<int> lengths = {512, 1024, 2048, 3072, 4096};
  int depths = 11, layers = 4, window = 32;
  for (int i = 1; i < argc; ++i) {
    const bool has = i + 1 < argc;
    if (!std::strcmp(argv[i], "--budget") && has) {
      budget = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--depths") && has) {
      depths = std::max(2, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--layers") && has) {
      layers = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--lengths") && has) {
      lengths.clear();
      std::stringstream ss(argv[++i]);
      for (std::string tok; std::getline(ss, tok, ',');) lengths.push_back(std::atoi(tok.c_str()));
    } else {
      std::fprintf(stderr, "usage: %s [--budget F] [--lengths N,N,...] [--depths N] [--layers N]\n",
                   argv[0]);
      return 2;
    }
  }
  std::printf("{\"budget\": %g, \"window_size\": %d, \"layers\": %d, \"lengths\": [", budget,
              window, layers);
  for (size_t i = 0; i < lengths.size(); ++i) std::printf("%s%d", i ? ", " : "", lengths[i]);
  std::printf("], \"depths\": [");
  for (int d = 0; d < depths; ++d) std::printf("%s%g", d ? ", " : "", 100.0 * d / (depths - 1));
  std::printf("], \"methods\": {");
  const CompressMethod methods[] = {CompressMethod::kStreamingLlm, CompressMethod::kH2O,
                                    CompressMethod::kSnapKv, CompressMethod::kPyramidKv};
  for (size_t m = 0; m < 4; ++m) {
    std::printf("%s\"%s\": [", m ? ", " : "", CompressMethodName(methods[m]));
    for (size_t li = 0; li < lengths.size(); ++li) {
      const int n = lengths[li];
      std::printf("%s[", li ? ", " : "");
      for (int d = 0; d < depths; ++d) {
        // Depth 0% is the first token, 100% the last token before the question.
        const int pos = static_cast<int>((n - window - 1) * static_cast<double>(d) / (depths - 1));
        testutil::SyntheticSpec spec;
        spec.shape.num_layers = layers;
        spec.shape.seq_len = n;
        spec.shape.num_q_heads = 4;
        spec.shape.num_kv_heads = 2;
        spec.shape.head_dim = 32;
        spec.shape.dtype = DType::kBFloat16;
        spec.window = window;
        spec.needle_pos = pos;
        spec.seed = 7000 + 31 * n + d;
        const auto a = testutil::MakeSynthetic(spec);
        CompressParams p;
        p.method = methods[m];
        p.window_size = window;
        p.max_capacity_prompt = std::max(window + 16, static_cast<int>(budget * n));
        std::vector<int> keep;
        auto idx = testutil::SelectCpu(a, p, &keep);
        if (!idx.ok()) {
          std::fprintf(stderr, "%s\n", idx.status().ToString().c_str());
          return 1;
        }
        std::printf("%s%.3f", d ? ", " : "", testutil::RetainedFraction(a.shape, keep, *idx, pos));
      }
      std::printf("]");
      std::fflush(stdout);
    }
    std::printf("]");
  }
  std::printf("}}\n");
  return 0;
}

}  // namespace
}  // namespace kernels
}  // namespace kvpool

int main(int argc, char** argv) { return kvpool::kernels::Main(argc, argv); }
