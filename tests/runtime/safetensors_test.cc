// safetensors reader/writer and checkpoint directories: round trips, sharding,
// and every malformed input giving a Status that names the file (and tensor).
#include "runtime/checkpoint/safetensors.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/core/file.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace mlag {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

// A fresh directory under the test temp dir.
using ::mlag::testing::MakeTempDir;

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string ReadBytes(const std::string& path) { return ReadFile(path).value(); }

std::string LengthPrefix(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// A safetensors file from a raw header text and `data_bytes` bytes of data.
std::string RawFile(const std::string& header, size_t data_bytes) {
  std::string data(data_bytes, '\0');
  for (size_t i = 0; i < data_bytes; ++i) data[i] = static_cast<char>(i * 7 + 1);
  return LengthPrefix(header.size()) + header + data;
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng() & 0xff);
  return v;
}

struct Spec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

size_t Bytes(const Spec& s) {
  size_t n = DTypeSize(s.dtype);
  for (int64_t d : s.shape) n *= static_cast<size_t>(d);
  return n;
}

const std::vector<Spec>& MixedSpecs() {
  static const std::vector<Spec> specs = {
      {"model.layers.0.w_f32", DType::kF32, {3, 5, 7}},
      {"model.layers.0.w_bf16", DType::kBF16, {1, 13}},
      {"a.f16", DType::kF16, {2, 3, 1, 5}},
      {"ids.i32", DType::kI32, {17}},
      {"ids.i64", DType::kI64, {3}},
      {"bytes.u8", DType::kU8, {5}},
      {"scalar", DType::kF32, {}},
      {"scalar_bf16", DType::kBF16, {}},
      {"empty", DType::kF32, {0, 4}},
      {"z.odd_f16", DType::kF16, {11, 3}},
  };
  return specs;
}

// ---- round trips ------------------------------------------------------------------

TEST(SafetensorsTest, RoundTripMixedDtypesBytesIdentical) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/model.safetensors";
  SafetensorsWriter writer;
  std::vector<std::vector<uint8_t>> payloads;
  uint32_t seed = 1;
  for (const Spec& s : MixedSpecs()) {
    payloads.push_back(RandomBytes(Bytes(s), seed++));
    ASSERT_OK(writer.Add(s.name, s.dtype, s.shape, payloads.back().data())) << s.name;
  }
  writer.SetMetadata("origin", "test");
  ASSERT_OK(writer.Write(path));
  // The writer copied: clobbering the sources after Add must not matter.
  std::vector<std::vector<uint8_t>> expected = payloads;
  for (auto& p : payloads) std::fill(p.begin(), p.end(), 0xAB);

  // Layout: header length a multiple of 8, data packed with no gaps.
  const std::string raw = ReadBytes(path);
  ASSERT_GE(raw.size(), 8u);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i)
    header_len |= static_cast<uint64_t>(static_cast<uint8_t>(raw[i])) << (8 * i);
  EXPECT_EQ(header_len % 8, 0u);
  size_t total = 0;
  for (const Spec& s : MixedSpecs()) total += Bytes(s);
  EXPECT_EQ(raw.size(), 8 + header_len + total);
  const json header = json::parse(raw.substr(8, header_len));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["__metadata__"]["origin"], "test");

  auto file_or = SafetensorsFile::Open(path);
  ASSERT_OK(file_or);
  const SafetensorsFile& file = **file_or;
  EXPECT_EQ(file.tensors().size(), MixedSpecs().size());
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.metadata().at("origin"), "test");
  for (size_t i = 1; i < file.tensors().size(); ++i) {
    EXPECT_LT(file.tensors()[i - 1].name, file.tensors()[i].name);
  }
  for (size_t i = 0; i < MixedSpecs().size(); ++i) {
    const Spec& s = MixedSpecs()[i];
    const SafetensorsTensor* t = file.Find(s.name);
    ASSERT_NE(t, nullptr) << s.name;
    EXPECT_EQ(t->name, s.name);
    EXPECT_EQ(t->dtype, s.dtype) << s.name;
    EXPECT_EQ(t->shape, s.shape) << s.name;
    EXPECT_EQ(t->nbytes, Bytes(s)) << s.name;
    EXPECT_EQ(t->file, path);
    if (t->nbytes == 0) {
      EXPECT_EQ(t->data, nullptr);
      continue;
    }
    ASSERT_NE(t->data, nullptr);
    // Ordered by element size, every tensor is aligned to its element.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % DTypeSize(s.dtype), 0u) << s.name;
    EXPECT_EQ(std::memcmp(t->data, expected[i].data(), t->nbytes), 0) << s.name;
  }
  EXPECT_EQ(file.Find("scalar")->numel(), 1);
  EXPECT_EQ(file.Find("empty")->numel(), 0);
  EXPECT_EQ(file.Find("nope"), nullptr);
  EXPECT_EQ(file.Find(""), nullptr);

  // The same directory opens as a checkpoint.
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_OK(ckpt);
  EXPECT_EQ((*ckpt)->size(), MixedSpecs().size());
  EXPECT_TRUE(std::is_sorted((*ckpt)->names().begin(), (*ckpt)->names().end()));
  const SafetensorsTensor* w = (*ckpt)->Find("model.layers.0.w_f32");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(std::memcmp(w->data, expected[0].data(), w->nbytes), 0);
  EXPECT_EQ((*ckpt)->Find("model.layers.0"), nullptr);

  // Rewriting the file while it is mapped leaves the open views intact.
  SafetensorsWriter other;
  const float one = 1.0f;
  ASSERT_OK(other.Add("other", DType::kF32, {}, &one));
  ASSERT_OK(other.Write(path));
  EXPECT_EQ(std::memcmp(w->data, expected[0].data(), w->nbytes), 0);
  auto reopened = SafetensorsFile::Open(path);
  ASSERT_OK(reopened);
  EXPECT_EQ((*reopened)->tensors().size(), 1u);
  EXPECT_NE((*reopened)->Find("other"), nullptr);
}

TEST(SafetensorsTest, ReadsAHandWrittenReferenceFile) {
  // As the reference implementation writes {"a": f32 [2], "b": bf16 [1]}.
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/ref.safetensors";
  std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[1],"data_offsets":[8,10]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const float a[2] = {1.5f, -2.0f};
  const uint16_t b = 0x3f80;  // 1.0 in bf16
  std::string data(reinterpret_cast<const char*>(a), 8);
  data.append(reinterpret_cast<const char*>(&b), 2);
  WriteBytes(path, LengthPrefix(header.size()) + header + data);
  auto file = SafetensorsFile::Open(path);
  ASSERT_OK(file);
  const SafetensorsTensor* ta = (*file)->Find("a");
  ASSERT_NE(ta, nullptr);
  float got[2];
  std::memcpy(got, ta->data, 8);
  EXPECT_EQ(got[0], 1.5f);
  EXPECT_EQ(got[1], -2.0f);
  const SafetensorsTensor* tb = (*file)->Find("b");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->dtype, DType::kBF16);
  uint16_t got_b;
  std::memcpy(&got_b, tb->data, 2);
  EXPECT_EQ(got_b, 0x3f80);
}

TEST(SafetensorsTest, ShardedWriteLoadsTheSameTensors) {
  const std::string dir = MakeTempDir() + "/sharded";  // WriteSharded creates it
  SafetensorsWriter writer;
  std::vector<Spec> specs;
  for (int i = 0; i < 12; ++i) {
    specs.push_back({"model.layers." + std::to_string(i) + ".w",
                     i % 3 == 0 ? DType::kF32 : (i % 3 == 1 ? DType::kBF16 : DType::kF16),
                     {i + 1, 2 * i + 3}});
  }
  specs.push_back({"model.norm.weight", DType::kF32, {}});
  specs.push_back({"model.big", DType::kF32, {40, 40}});  // bigger than a shard
  std::vector<std::vector<uint8_t>> payloads;
  for (size_t i = 0; i < specs.size(); ++i) {
    payloads.push_back(RandomBytes(Bytes(specs[i]), 100 + static_cast<uint32_t>(i)));
    ASSERT_OK(writer.Add(specs[i].name, specs[i].dtype, specs[i].shape, payloads[i].data()));
  }
  ASSERT_OK(writer.WriteSharded(dir, 400));

  const json index = json::parse(ReadBytes(dir + "/model.safetensors.index.json"));
  std::set<std::string> shard_files;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    shard_files.insert(it.value().get<std::string>());
  }
  EXPECT_GT(shard_files.size(), 2u);
  const std::string n = std::to_string(shard_files.size());
  EXPECT_EQ(*shard_files.begin(),
            "model-00001-of-" + std::string(5 - n.size(), '0') + n + ".safetensors");
  size_t total = 0;
  for (const Spec& s : specs) total += Bytes(s);
  EXPECT_EQ(index["metadata"]["total_size"].get<size_t>(), total);

  auto ckpt = Checkpoint::Open(dir);
  ASSERT_OK(ckpt);
  EXPECT_EQ((*ckpt)->size(), specs.size());
  EXPECT_EQ((*ckpt)->files().size(), shard_files.size());
  EXPECT_TRUE(std::is_sorted((*ckpt)->names().begin(), (*ckpt)->names().end()));
  for (size_t i = 0; i < specs.size(); ++i) {
    const SafetensorsTensor* t = (*ckpt)->Find(specs[i].name);
    ASSERT_NE(t, nullptr) << specs[i].name;
    EXPECT_EQ(t->dtype, specs[i].dtype);
    EXPECT_EQ(t->shape, specs[i].shape);
    ASSERT_EQ(t->nbytes, payloads[i].size());
    EXPECT_EQ(std::memcmp(t->data, payloads[i].data(), t->nbytes), 0) << specs[i].name;
    EXPECT_THAT(t->file, HasSubstr(index["weight_map"][specs[i].name].get<std::string>()));
  }
  EXPECT_EQ((*ckpt)->Find("model.layers.99.w"), nullptr);
}

TEST(SafetensorsTest, WriterRejectsBadAdds) {
  SafetensorsWriter writer;
  const float x[2] = {1, 2};
  ASSERT_OK(writer.Add("x", DType::kF32, {2}, x));
  EXPECT_EQ(writer.Add("x", DType::kF32, {2}, x).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(writer.Add("neg", DType::kF32, {-1, 2}, x).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.Add("__metadata__", DType::kF32, {2}, x).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.Add("", DType::kF32, {2}, x).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.Add("null", DType::kF32, {2}, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_OK(writer.Add("empty_null", DType::kF32, {0}, nullptr));
  EXPECT_EQ(writer.size(), 2u);
  const absl::Status s = writer.Write("/nonexistent-dir-mlag/x.safetensors");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("/nonexistent-dir-mlag/x.safetensors"));
}

// ---- malformed files ----------------------------------------------------------

struct BadFile {
  const char* label;
  std::string bytes;
  absl::StatusCode code;
  std::vector<std::string> mentions;  // besides the file name
};

std::string Entry(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return R"({"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}";
}

std::vector<BadFile> BadFiles() {
  using C = absl::StatusCode;
  const std::string ok_a = R"("a":)" + Entry("F32", "[2]", "[0,8]");
  std::vector<BadFile> v = {
      {"empty", "", C::kDataLoss, {"empty"}},
      {"short", std::string("\x05\0\0\0", 4), C::kDataLoss, {"8-byte"}},
      {"seven", std::string(7, '\0'), C::kDataLoss, {}},
      {"length_past_end", LengthPrefix(1000) + "{}", C::kDataLoss, {"1000"}},
      {"length_huge", LengthPrefix(~uint64_t{0}) + "{}", C::kDataLoss, {}},
      {"zero_length_header", LengthPrefix(0), C::kInvalidArgument, {"JSON"}},
      {"not_json", RawFile("{not json}", 0), C::kInvalidArgument, {"JSON"}},
      {"truncated_json", RawFile(R"({"a":{"dtype":"F32")", 0), C::kInvalidArgument, {"JSON"}},
      {"not_object", RawFile("[1,2,3]", 0), C::kInvalidArgument, {"array"}},
      {"entry_not_object", RawFile(R"({"w":3})", 0), C::kInvalidArgument, {"w"}},
      {"missing_dtype",
       RawFile(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", 8),
       C::kInvalidArgument,
       {"w", "dtype"}},
      {"missing_shape",
       RawFile(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", 8),
       C::kInvalidArgument,
       {"w", "shape"}},
      {"missing_offsets",
       RawFile(R"({"w":{"dtype":"F32","shape":[2]}})", 8),
       C::kInvalidArgument,
       {"w", "data_offsets"}},
      {"dtype_not_string",
       RawFile(R"({"w":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", 8),
       C::kInvalidArgument,
       {"w", "dtype"}},
      {"unknown_dtype",
       RawFile("{\"w\":" + Entry("Q7", "[2]", "[0,8]") + "}", 8),
       C::kInvalidArgument,
       {"w", "Q7"}},
      {"fp8_e5m2_dtype",
       RawFile("{\"w\":" + Entry("F8_E5M2", "[2]", "[0,2]") + "}", 8),
       C::kUnimplemented,
       {"w", "F8_E5M2"}},
      {"f64_dtype",  // the message lists what is read, fp8 included
       RawFile("{\"w\":" + Entry("F64", "[2]", "[0,16]") + "}", 16),
       C::kUnimplemented,
       {"w", "F64", "F8_E4M3"}},
      {"nul_in_header",  // the JSON parser would stop at it and ignore the rest
       RawFile("{\"w\":" + Entry("F32", "[2]", "[0,8]") + "}" + std::string(1, '\0') +
                   "{\"x\":" + Entry("F32", "[2]", "[0,8]") + "}",
               8),
       C::kInvalidArgument,
       {"NUL"}},
      {"negative_dim",
       RawFile("{\"w\":" + Entry("F32", "[-1,2]", "[0,8]") + "}", 8),
       C::kInvalidArgument,
       {"w", "-1"}},
      {"float_dim",
       RawFile("{\"w\":" + Entry("F32", "[2.5]", "[0,8]") + "}", 8),
       C::kInvalidArgument,
       {"w", "shape"}},
      {"shape_not_array",
       RawFile("{\"w\":" + Entry("F32", "2", "[0,8]") + "}", 8),
       C::kInvalidArgument,
       {"w", "shape"}},
      {"shape_overflow",
       RawFile("{\"w\":" + Entry("F32", "[4294967296,4294967296]", "[0,8]") + "}", 8),
       C::kInvalidArgument,
       {"w"}},
      {"offsets_one",
       RawFile("{\"w\":" + Entry("F32", "[2]", "[0]") + "}", 8),
       C::kInvalidArgument,
       {"w", "data_offsets"}},
      {"offsets_three",
       RawFile("{\"w\":" + Entry("F32", "[2]", "[0,8,8]") + "}", 8),
       C::kInvalidArgument,
       {"w", "data_offsets"}},
      {"offsets_string",
       RawFile("{\"w\":" + Entry("F32", "[2]", "[\"0\",8]") + "}", 8),
       C::kInvalidArgument,
       {"w", "data_offsets"}},
      {"offsets_float",
       RawFile("{\"w\":" + Entry("F32", "[2]", "[0,8.5]") + "}", 8),
       C::kInvalidArgument,
       {"w", "data_offsets"}},
      {"offsets_negative",
       RawFile("{\"w\":" + Entry("F32", "[2]", "[-8,0]") + "}", 8),
       C::kInvalidArgument,
       {"w", "data_offsets"}},
      {"offsets_not_array",
       RawFile("{\"w\":" + Entry("F32", "[2]", "{}") + "}", 8),
       C::kInvalidArgument,
       {"w", "data_offsets"}},
      {"end_before_begin",
       RawFile("{\"w\":" + Entry("F32", "[0]", "[8,4]") + "}", 8),
       C::kInvalidArgument,
       {"w", "end before begin"}},
      {"past_data_end",
       RawFile("{\"w\":" + Entry("F32", "[100]", "[0,400]") + "}", 16),
       C::kDataLoss,
       {"w", "400"}},
      {"size_mismatch",
       RawFile("{\"w\":" + Entry("F32", "[2]", "[0,12]") + "}", 16),
       C::kInvalidArgument,
       {"w", "12"}},
      {"overlap",
       RawFile("{\"a\":" + Entry("F32", "[2]", "[0,8]") +
                   ",\"b\":" + Entry("F32", "[2]", "[4,12]") + "}",
               16),
       C::kInvalidArgument,
       {"'a'", "'b'", "overlap"}},
      {"overlap_contained",
       RawFile("{\"a\":" + Entry("F32", "[4]", "[0,16]") + ",\"b\":" +
                   Entry("F32", "[1]", "[8,12]") + ",\"c\":" + Entry("F32", "[1]", "[12,16]") + "}",
               16),
       C::kInvalidArgument,
       {"'a'", "overlap"}},
      {"duplicate_name",
       RawFile("{" + ok_a + ",\"a\":" + Entry("F32", "[2]", "[8,16]") + "}", 16),
       C::kInvalidArgument,
       {"\"a\"", "twice"}},
      {"duplicate_field",
       RawFile(R"({"w":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}})", 8),
       C::kInvalidArgument,
       {"dtype", "twice"}},
      {"metadata_not_object",
       RawFile(R"({"__metadata__":[1]})", 0),
       C::kInvalidArgument,
       {"__metadata__"}},
      {"metadata_not_strings",
       RawFile(R"({"__metadata__":{"format":1}})", 0),
       C::kInvalidArgument,
       {"__metadata__", "format"}},
  };
  return v;
}

TEST(SafetensorsTest, EveryMalformedFileIsAnErrorNamingIt) {
  const std::string dir = MakeTempDir();
  for (const BadFile& bad : BadFiles()) {
    SCOPED_TRACE(bad.label);
    const std::string path = dir + "/" + bad.label + ".safetensors";
    WriteBytes(path, bad.bytes);
    auto file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok());
    EXPECT_EQ(file.status().code(), bad.code) << file.status();
    const std::string message(file.status().message());
    EXPECT_THAT(message, HasSubstr(path));
    for (const std::string& m : bad.mentions) EXPECT_THAT(message, HasSubstr(m));
  }
}

TEST(SafetensorsTest, MissingFileAndDirectoryAreErrors) {
  const std::string dir = MakeTempDir();
  auto missing = SafetensorsFile::Open(dir + "/absent.safetensors");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("absent.safetensors"));
  auto a_dir = SafetensorsFile::Open(dir);
  EXPECT_FALSE(a_dir.ok());
  EXPECT_THAT(std::string(a_dir.status().message()), HasSubstr(dir));
}

// Truncating a valid file anywhere, or flipping header bytes, never crashes.
TEST(SafetensorsTest, TruncatedAndCorruptedFilesNeverCrash) {
  const std::string dir = MakeTempDir();
  const std::string good_path = dir + "/good.safetensors";
  SafetensorsWriter writer;
  std::vector<std::vector<uint8_t>> payloads;
  uint32_t seed = 7;
  for (const Spec& s : MixedSpecs()) {
    payloads.push_back(RandomBytes(Bytes(s), seed++));
    ASSERT_OK(writer.Add(s.name, s.dtype, s.shape, payloads.back().data()));
  }
  ASSERT_OK(writer.Write(good_path));
  const std::string good = ReadBytes(good_path);
  // A new file per variant: rewriting one file in place makes ext4 flush it
  // at every close (its replace-via-truncate heuristic), which is slow.
  int variant = 0;
  std::string path;
  auto next_path = [&]() {
    if (!path.empty()) ::unlink(path.c_str());
    path = dir + "/bad" + std::to_string(variant++) + ".safetensors";
    return path;
  };
  int failures = 0;
  for (size_t len = 0; len < good.size(); ++len) {
    WriteBytes(next_path(), good.substr(0, len));
    auto file = SafetensorsFile::Open(path);
    if (!file.ok()) {
      ++failures;
      EXPECT_THAT(std::string(file.status().message()), HasSubstr(path));
    }
  }
  EXPECT_EQ(failures, static_cast<int>(good.size()));  // every truncation is caught
  std::mt19937 rng(42);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i)
    header_len |= static_cast<uint64_t>(static_cast<uint8_t>(good[i])) << (8 * i);
  for (int trial = 0; trial < 300; ++trial) {
    std::string bytes = good;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k) {
      bytes[rng() % (8 + header_len)] = static_cast<char>(rng() & 0xff);
    }
    WriteBytes(next_path(), bytes);
    auto file = SafetensorsFile::Open(path);
    if (!file.ok()) {
      EXPECT_THAT(std::string(file.status().message()), HasSubstr(path));
      continue;
    }
    for (const SafetensorsTensor& t : (*file)->tensors()) {  // views stay inside the mapping
      volatile uint8_t sink = 0;
      for (size_t i = 0; i < t.nbytes; ++i) sink = sink ^ static_cast<const uint8_t*>(t.data)[i];
      (void)sink;
    }
  }
}

// ---- checkpoint directories ----------------------------------------------------

// Writes shards "s1" (tensors a, b) and "s2" (tensor c) into `dir`.
void WriteTwoShards(const std::string& dir) {
  const float x[4] = {1, 2, 3, 4};
  SafetensorsWriter s1, s2;
  ASSERT_OK(s1.Add("a", DType::kF32, {2}, x));
  ASSERT_OK(s1.Add("b", DType::kF32, {2}, x + 2));
  ASSERT_OK(s2.Add("c", DType::kF32, {4}, x));
  ASSERT_OK(s1.Write(dir + "/s1.safetensors"));
  ASSERT_OK(s2.Write(dir + "/s2.safetensors"));
}

absl::Status OpenWithIndex(const std::string& index_text, std::string* dir_out) {
  const std::string dir = MakeTempDir();
  WriteTwoShards(dir);
  WriteBytes(dir + "/model.safetensors.index.json", index_text);
  *dir_out = dir;
  return Checkpoint::Open(dir).status();
}

TEST(CheckpointTest, HandWrittenIndexOpens) {
  std::string dir;
  const absl::Status s = OpenWithIndex(
      R"({"metadata":{"total_size":32},"weight_map":{"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors"}})",
      &dir);
  ASSERT_OK(s);
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_OK(ckpt);
  EXPECT_EQ((*ckpt)->names(), (std::vector<std::string>{"a", "b", "c"}));
  ASSERT_NE((*ckpt)->Find("c"), nullptr);
  EXPECT_THAT((*ckpt)->Find("c")->file, HasSubstr("s2.safetensors"));
  float c[4];
  std::memcpy(c, (*ckpt)->Find("c")->data, sizeof(c));
  EXPECT_EQ(c[3], 4.0f);
}

TEST(CheckpointTest, IndexErrorsNameTensorAndFile) {
  struct Case {
    const char* label;
    std::string index;
    absl::StatusCode code;
    std::vector<std::string> mentions;
  };
  using C = absl::StatusCode;
  const std::vector<Case> cases = {
      {"mapped_but_absent",
       R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors","d":"s2.safetensors"}})",
       C::kNotFound,
       {"'d'", "s2.safetensors"}},
      {"present_but_unmapped",
       R"({"weight_map":{"a":"s1.safetensors","c":"s2.safetensors"}})",
       C::kInvalidArgument,
       {"'b'", "s1.safetensors"}},
      {"mapped_to_missing_file",
       R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors","c":"s3.safetensors"}})",
       C::kNotFound,
       {"'c'", "s3.safetensors"}},
      {"mapped_to_other_shard",
       R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors","c":"s2.safetensors"}})",
       C::kNotFound,
       {"'b'", "s2.safetensors"}},
      {"escaping_name",
       R"({"weight_map":{"a":"../s1.safetensors"}})",
       C::kInvalidArgument,
       {"'a'", "../s1.safetensors"}},
      {"not_json", "{weight_map", C::kInvalidArgument, {"model.safetensors.index.json", "JSON"}},
      {"no_weight_map",
       R"({"metadata":{}})",
       C::kInvalidArgument,
       {"model.safetensors.index.json", "weight_map"}},
      {"file_not_string", R"({"weight_map":{"a":1}})", C::kInvalidArgument, {"'a'"}},
      {"duplicate_key",
       R"({"weight_map":{"a":"s1.safetensors","a":"s2.safetensors"}})",
       C::kInvalidArgument,
       {"\"a\"", "twice"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    std::string dir;
    const absl::Status s = OpenWithIndex(c.index, &dir);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(dir));
    for (const std::string& m : c.mentions) EXPECT_THAT(std::string(s.message()), HasSubstr(m));
  }
}

TEST(CheckpointTest, ShardMappedElsewhereWhileAlsoInNamedShardIsAnError) {
  // "b" is in s1 and the index maps it to s2, which also holds a "b".
  const std::string dir = MakeTempDir();
  WriteTwoShards(dir);
  const float x[2] = {5, 6};
  SafetensorsWriter s2;
  ASSERT_OK(s2.Add("b", DType::kF32, {2}, x));
  ASSERT_OK(s2.Add("c", DType::kF32, {2}, x));
  ASSERT_OK(s2.Write(dir + "/s2.safetensors"));
  WriteBytes(dir + "/model.safetensors.index.json",
             R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors","c":"s2.safetensors"}})");
  const absl::Status s = Checkpoint::Open(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("'b'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("s1.safetensors"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("s2.safetensors"));
}

TEST(CheckpointTest, DirectoryWithoutCheckpoint) {
  const std::string dir = MakeTempDir();
  auto empty = Checkpoint::Open(dir);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr(dir));

  auto absent = Checkpoint::Open(dir + "/nope");
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(absent.status().message()), HasSubstr(dir + "/nope"));

  WriteBytes(dir + "/plain_file", "x");
  auto file = Checkpoint::Open(dir + "/plain_file");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("plain_file"));

  // A broken model.safetensors is reported with its path.
  WriteBytes(dir + "/model.safetensors", "");
  auto broken = Checkpoint::Open(dir);
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(broken.status().message()), HasSubstr(dir + "/model.safetensors"));
}

}  // namespace
}  // namespace mlag
