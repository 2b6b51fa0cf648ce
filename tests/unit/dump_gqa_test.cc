// Grouped-query attention in the dump reader (eval::list_dump, eval::load_dump) and in eval::group_kv_heads: a layer
// of H_q query heads over H_kv K/V heads is read from the names alone, each K/V head once, query head h reading K/V
// head h / (H_q / H_kv); a shard reads only the K/V heads its query heads need; counts that do not divide, k and v
// counts that differ and a manifest that contradicts the files are refused naming both counts (docs/dumping.md). The
// helpers live in a named namespace: the unity build puts this file in one translation unit with others.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "qattn/eval/evaluate.h"
#include "qattn/tensor_io.h"
#include "support/dump_files.h"

using namespace qattn;
namespace fs = std::filesystem;

namespace dump_gqa_test {

using test::head_tensor;
using test::load_error;

std::string name(int layer, int head, const char* kind) {
  return "layer" + std::to_string(layer) + "_head" + std::to_string(head) + "_" + kind;
}

// Layer `layer` with q heads 0 .. nq - 1, k heads 0 .. nk - 1 and v heads 0 .. nv - 1 (k and v of head g: offset g).
void write_layer(const fs::path& dir, int layer, int nq, int nk, int nv) {
  for (int h = 0; h < nq; ++h) write_npy(dir / (name(layer, h, "q") + ".npy"), head_tensor(0.5 + h));
  for (int h = 0; h < nk; ++h) write_npy(dir / (name(layer, h, "k") + ".npy"), head_tensor(h));
  for (int h = 0; h < nv; ++h) write_npy(dir / (name(layer, h, "v") + ".npy"), head_tensor(10 + h));
}

TEST_CASE("GQA dump: K/V heads read once, each query head mapped to its contiguous group", "[dump][gqa]") {
  test::ScratchDir s("read");
  write_layer(s.dir, 0, 6, 2, 2);  // 3 query heads per K/V head
  write_layer(s.dir, 1, 2, 2, 2);  // one K/V head per query head, as before
  const eval::DumpListing listing = eval::list_dump(s.dir, eval::DumpTarget::attention);
  CHECK(listing.units == std::vector<std::pair<int, int>>{{0, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}, {0, 5}, {1, 0}, {1, 1}});
  const std::vector<eval::DumpLayer> dump = eval::load_dump(s.dir);
  REQUIRE(dump.size() == 2);
  const eval::DumpLayer& l = dump[0];
  CHECK(l.heads == std::vector<int>{0, 1, 2, 3, 4, 5});
  CHECK(l.kv_group == 3);
  CHECK(l.q.size() == 6);
  CHECK(l.k.size() == 2);  // no copy per query head
  CHECK(l.v.size() == 2);
  CHECK(l.kv_of == std::vector<std::size_t>{0, 0, 0, 1, 1, 1});
  for (std::size_t h = 0; h < 6; ++h) {
    INFO("query head " << h);
    // batch entry 1 starts at element 32 of the file: offset + 0.01 * (32 % 13) - 0.05
    CHECK(l.k_at(h, 1)(0, 0) == Approx(static_cast<double>(h / 3) + 0.01).epsilon(1e-6));
    CHECK(l.v_at(h, 1)(0, 0) == Approx(10.0 + static_cast<double>(h / 3) + 0.01).epsilon(1e-6));
    CHECK(&l.k_at(h, 0) == &l.k[h / 3][0]);
  }
  CHECK(dump[1].kv_group == 1);
  CHECK(dump[1].kv_of.empty());
  CHECK(dump[1].k.size() == 2);
  // The reference of each query head uses its group's K/V (fp64 attention of the head's own triple)
  const auto fp64 = dump[0].reference;
  REQUIRE(fp64.size() == 6);
  CHECK((fp64[4][0].o - fp64[5][0].o).norm() > 0);  // different Q, same K/V
}

TEST_CASE("GQA dump: an archive's members are grouped as a directory's files", "[dump][gqa]") {
  test::ScratchDir s("archive");
  std::vector<NamedTensor> members;
  for (int h = 0; h < 4; ++h) members.push_back({name(0, h, "q"), head_tensor(h)});
  for (const char* kind : {"k", "v"}) members.push_back({name(0, 0, kind), head_tensor(7)});
  const fs::path st = s.dir / "dump.safetensors";
  write_safetensors(st, members);
  const std::vector<eval::DumpLayer> dump = eval::load_dump(st);
  REQUIRE(dump.size() == 1);
  CHECK(dump[0].kv_group == 4);
  CHECK(dump[0].k.size() == 1);
  CHECK(dump[0].kv_of == std::vector<std::size_t>{0, 0, 0, 0});
}

TEST_CASE("GQA dump: a shard reads its query heads and only the K/V heads of their groups", "[dump][gqa]") {
  test::ScratchDir s("shard");
  write_layer(s.dir, 0, 4, 2, 2);
  const eval::DumpListing listing = eval::list_dump(s.dir, eval::DumpTarget::attention);
  std::vector<std::string> read;
  eval::DumpFilter filter;
  filter.keep = [](int, int head) { return head == 1 || head == 2; };  // one query head of each group
  filter.listing = &listing;
  filter.files_read = &read;
  const std::vector<eval::DumpLayer> dump =
      eval::load_dump(s.dir, eval::DumpTarget::attention, eval::SoftmaxReference::fp64, &filter, false);
  REQUIRE(dump.size() == 1);
  CHECK(dump[0].heads == std::vector<int>{1, 2});
  CHECK(dump[0].k.size() == 2);
  CHECK(dump[0].kv_of == std::vector<std::size_t>{0, 1});
  CHECK(dump[0].k_at(1, 0)(0, 0) == Approx(1 - 0.05).epsilon(1e-6));
  std::vector<std::string> names;
  for (const std::string& f : read) names.push_back(fs::path(f).filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"layer0_head0_k.npy", "layer0_head0_v.npy", "layer0_head1_k.npy",
                                          "layer0_head1_q.npy", "layer0_head1_v.npy", "layer0_head2_q.npy"});
  // query heads 2 and 3 only: K/V head 1 alone
  filter.keep = [](int, int head) { return head >= 2; };
  read.clear();
  const auto upper = eval::load_dump(s.dir, eval::DumpTarget::attention, eval::SoftmaxReference::fp64, &filter, false);
  CHECK(upper[0].k.size() == 1);
  CHECK(upper[0].kv_of == std::vector<std::size_t>{0, 0});
  CHECK(upper[0].k_at(0, 0)(0, 0) == Approx(1 - 0.05).epsilon(1e-6));
  CHECK(read.size() == 4);
}

TEST_CASE("GQA dump: counts that do not divide, k and v counts that differ are refused naming both", "[dump][gqa]") {
  SECTION("3 K/V heads for 4 query heads") {
    test::ScratchDir s("nodiv");
    write_layer(s.dir, 0, 4, 3, 3);
    const std::string e = s.dir.string() + ": --tensors: layer 0 has 4 q heads, 3 k and v heads: grouped-query "
                          "attention needs the K/V head count to divide the query head count";
    CHECK(load_error(s.dir) == e);
    // every shard refuses it, one that owns no head included
    CHECK_THROWS_WITH(eval::list_dump(s.dir, eval::DumpTarget::attention), e);
  }
  SECTION("2 k heads, 1 v head") {
    test::ScratchDir s("kv");
    write_layer(s.dir, 0, 4, 2, 1);
    CHECK(load_error(s.dir) == s.dir.string() + ": --tensors: layer 0 has 4 q heads, 2 k heads and 1 v heads: "
                               "grouped-query attention needs as many k heads as v heads (layer0_head1_v.npy is missing)");
  }
  SECTION("a k file missing from a dump with one K/V head per query head") {
    test::ScratchDir s("missing");
    write_layer(s.dir, 0, 4, 3, 4);
    CHECK_THAT(load_error(s.dir), Catch::Contains("3 k heads and 4 v heads") && Catch::Contains("layer0_head3_k.npy is missing"));
  }
  SECTION("head numbers that are not 0 .. H - 1 keep the per-head rule") {
    test::ScratchDir s("sparse");
    write_layer(s.dir, 0, 2, 2, 2);
    write_npy(s.dir / "layer0_head5_q.npy", head_tensor(0));
    CHECK_THAT(load_error(s.dir), Catch::Contains("layer0_head5_k.npy is missing (q, k and v are all needed)"));
  }
}

TEST_CASE("GQA dump: manifest.json's num_kv_heads is read and checked against the files", "[dump][gqa][manifest]") {
  test::ScratchDir s("manifest");
  write_layer(s.dir, 0, 4, 2, 2);
  const fs::path m = s.dir / "manifest.json";
  std::ofstream(m) << R"({"layers": [{"layer": 0, "num_heads": 4, "num_kv_heads": 2}]})";
  CHECK(load_error(s.dir).empty());
  std::ofstream(m) << R"({"layers": [{"layer": 0, "num_kv_heads": 4}]})";
  CHECK(load_error(s.dir) == m.string() + ": layers[0].num_kv_heads: says 4 K/V heads, the dump has 2 (k and v files of "
                                          "layer 0, for 4 query heads)");
  std::ofstream(m) << R"({"layers": [{"layer": 0, "num_kv_heads": 0}]})";
  CHECK(load_error(s.dir) == m.string() + ": layers[0].num_kv_heads: expected an integer in [1, 2147483647]");
  // a dump with K/V per query head: num_kv_heads must be its head count
  test::ScratchDir r("manifest-mha");
  write_layer(r.dir, 0, 4, 4, 4);
  std::ofstream(r.dir / "manifest.json") << R"({"layers": [{"layer": 0, "num_kv_heads": 2}]})";
  CHECK(load_error(r.dir) == (r.dir / "manifest.json").string() +
                                 ": layers[0].num_kv_heads: says 2 K/V heads, the dump has 4 (k and v files of layer 0, "
                                 "for 4 query heads)");
  std::ofstream(r.dir / "manifest.json") << R"({"layers": [{"layer": 0, "num_kv_heads": 4}]})";
  CHECK(load_error(r.dir).empty());
}

TEST_CASE("group_kv_heads: the K/V matrix each Q matrix reads, and the shapes refused", "[gqa]") {
  using Shape = std::vector<std::int64_t>;
  const eval::KvGrouping same = eval::group_kv_heads({2, 4, 16, 8}, {2, 4, 32, 8}, {2, 4, 32, 5}, "q", "k", "v");
  for (std::int64_t e = 0; e < 8; ++e) CHECK(same.kv_entry(e) == e);
  const eval::KvGrouping g = eval::group_kv_heads({2, 6, 16, 8}, {2, 2, 32, 8}, {2, 2, 32, 8}, "q", "k", "v");
  CHECK(g.q_heads == 6);
  CHECK(g.kv_heads == 2);
  const std::vector<std::int64_t> want{0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3};  // batch 1's heads follow batch 0's
  for (std::int64_t e = 0; e < 12; ++e) CHECK(g.kv_entry(e) == want[static_cast<std::size_t>(e)]);
  const eval::KvGrouping three = eval::group_kv_heads({4, 16, 8}, {1, 32, 8}, {1, 32, 8}, "q", "k", "v");
  for (std::int64_t e = 0; e < 4; ++e) CHECK(three.kv_entry(e) == 0);
  const auto error = [](const Shape& q, const Shape& k, const Shape& v) {
    return test::input_error_text([&] { eval::group_kv_heads(q, k, v, "q.npy", "k.npy", "v.npy"); });
  };
  CHECK(error({2, 4, 16, 8}, {2, 3, 16, 8}, {2, 3, 16, 8}) ==
        "k.npy: shape: k and v have 3 heads (axis -3 of (2, 3, 16, 8)), q has 4 (q.npy, (2, 4, 16, 8)): grouped-query "
        "attention needs the K/V head count to divide the query head count");
  CHECK(error({2, 4, 16, 8}, {2, 2, 16, 8}, {2, 1, 16, 8}) ==
        "v.npy: shape: v has 1 heads (axis -3 of (2, 1, 16, 8)), k has 2 (k.npy, (2, 2, 16, 8)): grouped-query "
        "attention needs as many K heads as V heads");
  CHECK(error({4, 16, 8}, {0, 16, 8}, {0, 16, 8}) != "");  // no K/V head: refused, not divided by
  CHECK(error({2, 4, 16, 8}, {3, 2, 16, 8}, {3, 2, 16, 8}) ==
        "k.npy: shape: leading (batch) dimensions of q (2, 4, 16, 8), k (3, 2, 16, 8) and v (3, 2, 16, 8) differ");
  CHECK(error({16, 8}, {2, 16, 8}, {2, 16, 8}) ==
        "k.npy: shape: leading (batch) dimensions of q (16, 8), k (2, 16, 8) and v (2, 16, 8) differ");
}

}  // namespace dump_gqa_test
