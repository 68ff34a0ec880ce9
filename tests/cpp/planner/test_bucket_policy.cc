#include "catch.h"
#include "model_fixtures.h"
#include "planner/costs/bucket_policy.h"

using namespace hybridplan;

TEST_CASE("bucket policy: DDP's caps, a bucket closes once it reaches its cap", "[buckets]") {
  CHECK(kDefaultFirstBucketCapBytes == 1024 * 1024);  // torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
  CHECK(kDefaultBucketCapBytes == 25 * 1024 * 1024);  // DDP's bucket_cap_mb=25
  // Caps 1000 then 5000: 32 + 1024 = 1056 >= 1000 closes the first bucket; 128 + 4096 + 128 +
  // 2048 = 6400 >= 5000 the second; reaching the cap exactly closes a bucket too.
  CHECK((bucket_bytes({32, 1024, 128, 4096, 128, 2048}, {1000, 5000}) == std::vector<int64_t>{1056, 6400}));
  CHECK((bucket_bytes({500, 500, 1}, BucketCaps::uniform(1000)) == std::vector<int64_t>{1000, 1}));
  CHECK(bucket_bytes({}).empty());
  // 30 layers of a 1 MiB weight and a 2 KiB bias, last layer first: 1 MiB + 2 KiB, then 25 layers.
  std::vector<int64_t> ready;
  for (int i = 0; i < 30; ++i) ready.insert(ready.end(), {2048, 1024 * 1024});
  const int64_t layer = 1024 * 1024 + 2048;
  CHECK((bucket_bytes(ready) == std::vector<int64_t>{layer, 25 * layer, 4 * layer}));
  CHECK(test::input_error_of([] { bucket_bytes({1}, BucketCaps{0, 1}); }) ==
        "bucket caps must be >= 1 byte (got 0, 1)");
  CHECK(test::input_error_of([] { bucket_bytes({1, -1}); }) == "grad_bytes[1] must be >= 0 (got -1)");
}
