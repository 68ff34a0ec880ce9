// csrc/common: sha256, units, json_io, json_fields.
#include "catch.h"
#include "common/json_fields.h"
#include "common/json_io.h"
#include "common/sha256.h"
#include "common/units.h"
#include "model_fixtures.h"

using namespace hybridplan;

TEST_CASE("sha256 matches the FIPS 180-4 test vectors", "[common]") {
  REQUIRE(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  REQUIRE(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  REQUIRE(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // 55, 56 and 64 bytes straddle the padding boundary.
  REQUIRE(sha256_hex(std::string(55, 'a')) == "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  REQUIRE(sha256_hex(std::string(56, 'a')) == "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  REQUIRE(sha256_hex(std::string(64, 'a')) == "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
  REQUIRE(sha256_hex(std::string(1000000, 'a')) ==
          "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("units format bytes and seconds for people", "[common]") {
  REQUIRE(format_bytes(0) == "0 B");
  REQUIRE(format_bytes(512) == "512 B");
  REQUIRE(format_bytes(1536) == "1.50 KiB");
  REQUIRE(format_bytes(17179869184.0) == "16.0 GiB");
  REQUIRE(format_seconds(0) == "0 s");
  REQUIRE(format_seconds(2.5e-7) == "250 ns");
  REQUIRE(format_seconds(1.234e-5) == "12.3 us");
  REQUIRE(format_seconds(0.0456) == "45.6 ms");
  REQUIRE(format_seconds(0.9999) == "1000 ms");
  REQUIRE(format_seconds(3.5) == "3.50 s");
  REQUIRE(format_seconds(600) == "10.0 min");
  REQUIRE(format_seconds(5 * 3600) == "5.00 h");
  REQUIRE(format_seconds(3 * 86400) == "3.00 days");
  REQUIRE(format_count(533.3) == "533.3");
  REQUIRE(format_count(2.5e6) == "2.50M");
  REQUIRE(format_bandwidth(2.5e10) == "25.0 GB/s");
}

TEST_CASE("json_io: errors name the file; writes are atomic", "[common]") {
  REQUIRE(test::input_error_of([] { parse_json_text("[1, 2", "text"); })
              .rfind("text: invalid JSON: parse error at line 1, column 6", 0) == 0);
  REQUIRE(test::input_error_of([] { parse_json_text("{\"x\": 1e999}", "big.json"); }) ==
          "big.json: invalid JSON: number overflow parsing '1e999'");
  const std::string path = (test::scratch_dir() / "atomic.json").string();
  write_json_file(path, Json::parse(R"({"b": 1, "a": [true]})"));
  REQUIRE(read_json_file(path) == Json::parse(R"({"a": [true], "b": 1})"));
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(text == "{\"a\":[true],\"b\":1}\n");  // canonical: sorted keys, no spaces
  REQUIRE(test::input_error_of([] { write_file_atomic("/nonexistent-dir/x.json", "{}"); }) ==
          "/nonexistent-dir/x.json: cannot write file (No such file or directory)");
}

TEST_CASE("json_fields: typed access with paths", "[common]") {
  const JsonReader in("f.json");
  const Json j = Json::parse(R"({"n": 3, "big": 1e9, "x": 2.5, "s": "t", "o": {}})");
  REQUIRE(in.field_int(j, "", "n") == 3);
  REQUIRE(in.field_int(j, "", "big") == 1000000000);  // integral float accepted
  REQUIRE(in.field_number(j, "", "n") == 3);
  REQUIRE(test::input_error_of([&] { in.field_int(j, "", "x"); }) == "f.json: x must be an integer (got 2.5)");
  REQUIRE(test::input_error_of([&] { in.field_string(j, "", "n"); }) == "f.json: n must be a string (got 3)");
  REQUIRE(test::input_error_of([&] { in.field_int(j["o"], "o", "k"); }) == "f.json: o.k is required");
  REQUIRE(test::input_error_of([&] { in.header(j, "hybridplan.graph"); }) ==
          "f.json: schema_version is required and must be 1");
  REQUIRE(json_number_text(-1.0) == "-1");
  REQUIRE(json_number_text(0.0021) == "0.0021");
  REQUIRE(json_value_text(Json(std::string(100, 'x'))).size() == 60);
}
