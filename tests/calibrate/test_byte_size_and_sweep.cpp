#include <doctest/doctest.h>

#include <vector>

#include "calibrate/byte_size.hpp"
#include "calibrate/sweep.hpp"

using namespace shardplan;
using namespace shardplan::calibrate;
using documents::Collective;

TEST_CASE("byte_size::nccl-tests suffixes are binary multiples") {
  CHECK(parse_byte_size("8") == 8u);
  CHECK(parse_byte_size("64K") == 65536u);
  CHECK(parse_byte_size("64k") == 65536u);
  CHECK(parse_byte_size("32M") == 32u << 20);
  CHECK(parse_byte_size("1G") == 1ull << 30);
  CHECK(parse_byte_size("8g") == 8ull << 30);
  for (const char* bad :
       {"", "K", "1.5M", "-8", "+8", "8KB", "8 K", "abc", "99999999999999999999", "99999999999G"})
    CHECK_FALSE(parse_byte_size(bad).has_value());
  CHECK(format_byte_size(8) == "8");
  CHECK(format_byte_size(1536) == "1536");
  CHECK(format_byte_size(65536) == "64K");
  CHECK(format_byte_size(32u << 20) == "32M");
  CHECK(format_byte_size(1ull << 30) == "1G");
}

TEST_CASE("sweep::sizes from min to max by the factor") {
  CHECK(sweep_sizes({8, 128, 2}) == std::vector<std::uint64_t>{8, 16, 32, 64, 128});
  CHECK(sweep_sizes({8, 100, 4}) == std::vector<std::uint64_t>{8, 32});
  CHECK(sweep_sizes({64, 64, 2}) == std::vector<std::uint64_t>{64});
  CHECK(sweep_sizes({1, 1ull << 62, 2}).size() == 63);
  CHECK(sweep_sizes({8, 128, 1}).empty());
}

TEST_CASE("sweep::points follow nccl-tests' counts per collective") {
  // all_reduce: the per-rank buffer; count = size / 4.
  auto p = sweep_point(Collective::all_reduce, 4, 1000, 4);
  CHECK(p.size_bytes == 1000);
  CHECK(p.count == 250);
  CHECK(p.send_count == 250);
  CHECK(p.recv_count == 250);
  // all_gather on 3 ranks: 1000 B = 250 floats, 83 per rank, size 83·3·4 = 996.
  p = sweep_point(Collective::all_gather, 3, 1000, 4);
  CHECK(p.count == 83);
  CHECK(p.size_bytes == 996);
  CHECK(p.send_count == 83);
  CHECK(p.recv_count == 249);
  p = sweep_point(Collective::reduce_scatter, 3, 1000, 4);
  CHECK(p.count == 83);
  CHECK(p.send_count == 249);
  CHECK(p.recv_count == 83);
  p = sweep_point(Collective::all_to_all, 3, 1000, 4);
  CHECK(p.count == 83);
  CHECK(p.send_count == 249);
  CHECK(p.recv_count == 249);
  p = sweep_point(Collective::broadcast, 3, 1000, 4);
  CHECK(p.count == 250);
  // Too small for every rank to get an element.
  CHECK(sweep_point(Collective::all_gather, 8, 8, 4).count == 0);
}

TEST_CASE("sweep::empty and repeated points are dropped") {
  const auto points = sweep_points(Collective::all_gather, 8, {8, 256, 2}, 4);
  std::vector<std::uint64_t> sizes;
  sizes.reserve(points.size());
  for (const auto& p : points) sizes.push_back(p.size_bytes);
  CHECK(sizes == std::vector<std::uint64_t>{32, 64, 128, 256});
  const auto three = sweep_points(Collective::reduce_scatter, 3, {8, 64, 2}, 4);
  std::vector<std::uint64_t> three_sizes;
  three_sizes.reserve(three.size());
  for (const auto& p : three) three_sizes.push_back(p.size_bytes);
  CHECK(three_sizes == std::vector<std::uint64_t>{12, 24, 60});
}
