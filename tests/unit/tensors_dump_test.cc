// The dump reader (eval::load_dump): the names of a dump's files and archive members, and manifest.json. Each refusal
// is an InputError naming the file and the field (docs/tensor-io.md, error catalogue). The helpers live in a named
// namespace: the unity build puts this file in one translation unit with others.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "qattn/error.h"
#include "qattn/eval/evaluate.h"
#include "qattn/tensor_io.h"
#include "support/dump_files.h"

using namespace qattn;
namespace fs = std::filesystem;

namespace dump_reader_test {

using test::head_tensor;
using test::load_error;

// layer{L}_head{H}_{q,k,v}.npy for each (L, H).
void write_heads(const fs::path& dir, std::initializer_list<std::pair<int, int>> heads) {
  for (const auto& [l, h] : heads)
    for (const char* kind : {"q", "k", "v"})
      write_npy(dir / ("layer" + std::to_string(l) + "_head" + std::to_string(h) + "_" + kind + ".npy"), head_tensor(l + 0.1 * h));
}

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

TEST_CASE("dump names: two spellings of one (layer, head, kind) are refused, naming both", "[dump]") {
  test::ScratchDir s("spellings");
  write_heads(s.dir, {{0, 0}});
  write_npy(s.dir / "layer0_head00_k.npy", head_tensor(5));
  const std::string e = load_error(s.dir);
  CHECK_THAT(e, Catch::Contains("layer0_head00_k.npy and layer0_head0_k.npy both name layer 0 head 0's k"));
  // also when the duplicate is of a kind the target does not read, and outside a shard's filter
  fs::remove(s.dir / "layer0_head00_k.npy");
  write_npy(s.dir / "layer0_head0_logits.npy", head_tensor(0));
  write_npy(s.dir / "layer0_head000_logits.npy", head_tensor(0));
  CHECK_THAT(load_error(s.dir), Catch::Contains("both name layer 0 head 0's logits"));
  eval::DumpFilter none;
  none.keep = [](int, int) { return false; };
  CHECK_THROWS_AS(eval::load_dump(s.dir, eval::DumpTarget::attention, eval::SoftmaxReference::fp64, &none), InputError);
}

TEST_CASE("dump names: a head or layer number that does not parse, or is out of range, is refused", "[dump]") {
  test::ScratchDir s("numbers");
  write_heads(s.dir, {{0, 0}});
  for (const std::string bad : {"layer0_head+1_q.npy", "layer0_head-1_v.npy", "layer0_head9876543210_k.npy",
                                 "layer99999999999_head0_q.npy", "layer0_head2147483648_q.npy", "layerx_head0_logits.npy"}) {
    INFO(bad);
    write_npy(s.dir / bad, head_tensor(0));
    const std::string e = load_error(s.dir);
    CHECK_THAT(e, Catch::Contains((s.dir / bad).string() + ": name: "));
    CHECK_THAT(e, Catch::Contains("is not a decimal number") || Catch::Contains("is out of range [0, 2147483647]"));
    fs::remove(s.dir / bad);
  }
  // the largest number is a number; a leading zero is not another head (it is refused only beside its twin)
  write_npy(s.dir / "layer0_head2147483647_q.npy", head_tensor(0));
  CHECK_THAT(load_error(s.dir), Catch::Contains("layer0_head2147483647_k.npy is missing"));
  fs::remove(s.dir / "layer0_head2147483647_q.npy");
  CHECK(load_error(s.dir).empty());
}

TEST_CASE("dump names: archive members follow the directory's rules", "[dump]") {
  test::ScratchDir s("archive");
  const fs::path st = s.dir / "dump.safetensors";
  std::vector<NamedTensor> members;
  for (const char* kind : {"q", "k", "v"}) members.push_back({std::string("layer0_head0_") + kind, head_tensor(0)});
  members.push_back({"layer0_head00_v", head_tensor(1)});
  write_safetensors(st, members);
  CHECK_THAT(load_error(st), Catch::Contains("both name layer 0 head 0's v"));
  members.back() = {"layer0_head+1_q", head_tensor(1)};
  write_safetensors(st, members);
  CHECK_THAT(load_error(st), Catch::Contains(st.string() + ":layer0_head+1_q: name: head number '+1' is not a decimal number"));
  members.back() = {"layer0_haed1_q", head_tensor(1)};  // a stray: not read, named in the errors
  members.erase(members.begin() + 2);                     // v missing
  write_safetensors(st, members);
  CHECK_THAT(load_error(st), Catch::Contains("tensors not read, named like none of the dump's: layer0_haed1_q"));
  if (have_npz()) {
    const fs::path npz = s.dir / "dump.npz";
    write_npz(npz, {{"layer0_head0_q", head_tensor(0)}, {"layer0_head0_k", head_tensor(0)},
                    {"layer0_head0_v", head_tensor(0)}, {"layer0_head0_q.npy", head_tensor(1)}});
    CHECK_THAT(load_error(npz), Catch::Contains("layer0_head0_q and layer0_head0_q.npy both name layer 0 head 0's q"));
  }
}

TEST_CASE("manifest.json: keys given twice in one object are refused, naming the key", "[dump][manifest]") {
  test::ScratchDir s("manifest-dup");
  write_heads(s.dir, {{0, 0}});
  const fs::path m = s.dir / "manifest.json";
  write_text(m, R"({"layers": [{"layer": 0, "scale": 0.5, "scale": 0.25}]})");
  CHECK(load_error(s.dir) == m.string() + ": layers[0].scale: the key is given twice in one object");
  write_text(m, R"({"layers": {"0": {"scale": 0.5}, "0": {"scale": 0.25}}})");
  CHECK(load_error(s.dir) == m.string() + ": layers.0: the key is given twice in one object");
  write_text(m, R"({"causal": true, "causal": false})");
  CHECK(load_error(s.dir) == m.string() + ": causal: the key is given twice in one object");
  // in a value qattn does not read, too
  write_text(m, R"({"files": [{"name": "a"}, {"name": "a", "name": "b"}]})");
  CHECK(load_error(s.dir) == m.string() + ": files[1].name: the key is given twice in one object");
}

TEST_CASE("manifest.json: unknown keys are refused at every level qattn reads, naming the known ones", "[dump][manifest]") {
  test::ScratchDir s("manifest-keys");
  write_heads(s.dir, {{0, 0}});
  const fs::path m = s.dir / "manifest.json";
  write_text(m, R"({"layers": [{"layer": 0, "scael": 0.5}]})");
  CHECK_THAT(load_error(s.dir), Catch::StartsWith(m.string() + ": layers[0].scael: is not a key of a manifest here (known: layer, scale,"));
  write_text(m, R"({"Causal": true})");
  CHECK_THAT(load_error(s.dir), Catch::StartsWith(m.string() + ": Causal: is not a key of a manifest here (known: causal, layers,"));
  // the object form: an inner "layer" must equal its key
  write_text(m, R"({"layers": {"0": {"layer": 1}}})");
  CHECK(load_error(s.dir) == m.string() + ": layers[0].layer: is 1 in the entry keyed \"0\" (drop it, or make it equal)");
  write_text(m, R"({"layers": {"0": {"layer": 0, "scale": 0.5}}})");
  CHECK(load_error(s.dir).empty());
  // numbers beyond int are not read modulo 2^32
  write_text(m, R"({"layers": [{"layer": 4294967296}]})");
  CHECK(load_error(s.dir) == m.string() + ": layers[0].layer: expected a layer number in [0, 2147483647]");
  write_text(m, R"({"layers": [{"layer": 0, "num_heads": 4294967297}]})");
  CHECK(load_error(s.dir) == m.string() + ": layers[0].num_heads: expected an integer in [1, 2147483647]");
  write_text(m, R"({"layers": [{"layer": 0, "num_heads": 1, "n_heads": 2}]})");
  CHECK(load_error(s.dir) == m.string() + ": layers[0].n_heads: says 2 heads, num_heads 1: give one");
}

TEST_CASE("manifest.json: every key the repository's writers put there is known", "[dump][manifest]") {
  test::ScratchDir s("manifest-writers");
  write_heads(s.dir, {{0, 0}, {1, 0}});
  // cli/dump_torch.py (record, hook_projections), experiments/data/use-lite/make_subset.py, and the tools that
  // wrote the full USE-Lite dump (../shared/data/use-lite)
  write_text(s.dir / "manifest.json", R"({
    "format": "qattn dump v1", "source": "s", "causal": false,
    "files": [{"name": "layer0_head0_q.npy", "shape": [2, 4, 8], "dtype": "float32"}],
    "model": "m", "weights_source": "w", "weights_license": "l", "text_source": "t", "text_license_note": "n",
    "text_sha256": "0", "n_seq": 2, "seq_len": 4, "layout": "x", "token_ids": [[1]], "tokens": [["a"]],
    "layout_projections": "p", "final_embedding": {"file": "f.npy", "shape": [2, 8]}, "sanity": {"a": 1},
    "layers": {"0": {"source": "record", "layout": "bhld", "scale": 0.5, "causal": true},
               "1": {"source": "projections", "num_heads": 1, "num_kv_heads": 1, "layer": 1, "n_heads": 1,
                     "head_dim": 8, "heads": [{"head": 0}], "d_model": 8, "d_out": 8, "attn_input": {},
                     "projections": {}, "projection_source": "p"}}})");
  CHECK(load_error(s.dir).empty());
  for (const char* sample : {"experiments/data/use-lite"}) {
    const fs::path dir = fs::path(QATTN_FIXTURES) / ".." / ".." / sample;
    if (fs::exists(dir / "manifest.json")) CHECK(load_error(dir).empty());
  }
  const fs::path full = fs::path(QATTN_SHARED_DATA) / "use-lite";
  if (fs::exists(full / "manifest.json")) CHECK(load_error(full).empty());
}

}  // namespace dump_reader_test
