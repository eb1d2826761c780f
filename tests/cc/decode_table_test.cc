// The CUDA block decoder fills its lookup table entry by entry (DecodeEntryAt over CanonicalCodeOf and
// SortByCode, xla_ffi/codec/huffman.h); the CPU driver fills it symbol by symbol (BuildDecodeTable over
// BuildEncodeTable). For random valid code-length vectors (one symbol, complete and incomplete codes, lengths
// up to kMaxCodeLen, all 257 symbols, and the lengths BuildCodeLengths gives random histograms) the two tables
// must be equal entry for entry, including the {0, 0, 0} entries no code covers. Over-subscribed lengths must be
// refused by both. Header-only: needs no driver (tests/test_decode_table.py builds it with g++).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/cc/check.h"
#include "xla_ffi/codec/huffman.h"

using namespace zipccl;

namespace {

using Lens = std::vector<uint8_t>;  // kNumSymbols code lengths, 0 = unused

// A prefix code with `leaves` codes, none longer than kMaxCodeLen, as a multiset of lengths: start from the
// empty code (one leaf of depth 0) and split random leaves until there are `leaves` (complete: Kraft sum 1).
// `deep` splits the deepest splittable leaf, which reaches kMaxCodeLen quickly.
std::vector<int> CompleteDepths(int leaves, bool deep, std::mt19937& rng) {
  std::vector<int> d{0};
  while (int(d.size()) < leaves) {
    std::vector<int> splittable;
    for (int i = 0; i < int(d.size()); ++i)
      if (d[i] < kMaxCodeLen) splittable.push_back(i);
    if (splittable.empty()) break;  // 2048 leaves of length 11: cannot happen with <= 257
    int i = splittable[rng() % splittable.size()];
    if (deep)
      for (int j : splittable)
        if (d[j] > d[i]) i = j;
    const int depth = ++d[i];
    d.push_back(depth);
  }
  return d;
}

// The depths given to distinct random symbols.
Lens Assign(const std::vector<int>& depths, std::mt19937& rng) {
  std::vector<int> syms(kNumSymbols);
  for (int s = 0; s < kNumSymbols; ++s) syms[s] = s;
  std::shuffle(syms.begin(), syms.end(), rng);
  Lens lens(kNumSymbols, 0);
  for (size_t k = 0; k < depths.size(); ++k) lens[syms[k]] = uint8_t(depths[k]);
  return lens;
}

uint32_t KraftSum(const Lens& lens) {  // in units of 2^-kMaxCodeLen
  uint32_t k = 0;
  for (int s = 0; s < kNumSymbols; ++s)
    if (lens[s]) k += 1u << (kMaxCodeLen - lens[s]);
  return k;
}

std::string Show(const Lens& lens) {
  std::string out;
  for (int s = 0; s < kNumSymbols; ++s)
    if (lens[s]) out += std::to_string(s) + ":" + std::to_string(lens[s]) + " ";
  return out;
}

// Both tables of `lens`, compared entry for entry; and the symbol-wise table decodes every symbol's own code.
void CheckTablesAgree(const Lens& lens, const char* what) {
  uint32_t enc[kNumSymbols];
  const bool valid = BuildEncodeTable(lens.data(), enc);
  CanonicalCode cc;
  CHECK_EQ(CanonicalCodeOf(lens.data(), cc), valid) << what << Show(lens);
  CHECK(valid == (KraftSum(lens) <= uint32_t(kTableSize))) << what << Show(lens);
  if (!valid) return;
  uint16_t sorted[kNumSymbols];
  SortByCode(lens.data(), cc, sorted);
  std::vector<DecodeEntry> by_symbol(kTableSize);
  BuildDecodeTable(enc, by_symbol.data());
  uint32_t uncovered = 0;
  for (uint32_t i = 0; i < uint32_t(kTableSize); ++i) {
    const DecodeEntry a = DecodeEntryAt(i, cc, sorted), b = by_symbol[i];
    uncovered += b.len == 0;
    if (a.sym != b.sym || a.len != b.len || a.pad != b.pad) {
      CHECK(false) << what << "entry " << i << " entry-wise {" << a.sym << ", " << +a.len << ", " << +a.pad
                   << "} symbol-wise {" << b.sym << ", " << +b.len << ", " << +b.pad << "}" << Show(lens);
      return;
    }
  }
  CHECK_EQ(uncovered, uint32_t(kTableSize) - KraftSum(lens)) << what << Show(lens);
  for (int s = 0; s < kNumSymbols; ++s) {
    if (!lens[s]) continue;
    const DecodeEntry e = by_symbol[enc[s] & 0xFFFFu];
    CHECK(e.sym == s && e.len == lens[s]) << what << "symbol " << s << Show(lens);
  }
}

TEST(reverse_bits_matches_the_device_formula) {
  // The device's ReverseBits is __brev(v) >> (32 - n); here __brev is a reference loop over 32 bits, and v
  // carries bits above n, which both must ignore.
  std::mt19937 rng(7);
  for (int n = 1; n <= 32; ++n) {
    for (int k = 0; k < 200; ++k) {
      const uint32_t v = rng();
      uint32_t brev = 0;
      for (int b = 0; b < 32; ++b) brev |= ((v >> b) & 1u) << (31 - b);
      CHECK_EQ(ReverseBits(v, n), brev >> (32 - n)) << "n " << n << " v " << v;
    }
  }
}

TEST(single_symbol) {
  for (int len = 1; len <= kMaxCodeLen; ++len)
    for (int s : {0, 1, 127, 255, int(kZeroSymbol)}) {
      Lens lens(kNumSymbols, 0);
      lens[s] = uint8_t(len);
      CheckTablesAgree(lens, "single symbol ");
    }
}

TEST(no_symbol) {  // ParseTable refuses it, but both tables are then all {0, 0, 0}
  CheckTablesAgree(Lens(kNumSymbols, 0), "no symbol ");
}

TEST(complete_codes) {
  std::mt19937 rng(1);
  for (int t = 0; t < 3000; ++t) {
    const int leaves = 2 + int(rng() % (kNumSymbols - 1));
    CheckTablesAgree(Assign(CompleteDepths(leaves, t % 3 == 0, rng), rng), "complete ");
  }
}

TEST(all_257_symbols) {
  std::mt19937 rng(2);
  for (int t = 0; t < 300; ++t) {
    const Lens lens = Assign(CompleteDepths(kNumSymbols, t % 2 == 0, rng), rng);
    CHECK_EQ(int(std::count(lens.begin(), lens.end(), 0)), 0);
    CheckTablesAgree(lens, "all symbols ");
  }
}

TEST(max_length_codes) {
  std::mt19937 rng(3);
  int reached = 0;
  for (int t = 0; t < 1000; ++t) {
    // 12 leaves or more: the deepest leaf is split until it is kMaxCodeLen deep, then the others.
    const Lens lens = Assign(CompleteDepths(kMaxCodeLen + 1 + int(rng() % 40), true, rng), rng);
    reached += *std::max_element(lens.begin(), lens.end()) == kMaxCodeLen;
    CheckTablesAgree(lens, "deep ");
  }
  CHECK_EQ(reached, 1000);
}

TEST(incomplete_codes) {
  // A complete code minus random symbols, and random lengths that happen to satisfy Kraft.
  std::mt19937 rng(4);
  for (int t = 0; t < 3000; ++t) {
    Lens lens = Assign(CompleteDepths(2 + int(rng() % (kNumSymbols - 1)), t % 3 == 0, rng), rng);
    const int drop = 1 + int(rng() % 8);
    for (int k = 0; k < drop; ++k) lens[rng() % kNumSymbols] = 0;
    CheckTablesAgree(lens, "incomplete ");
    Lens r(kNumSymbols, 0);
    const int used = 1 + int(rng() % 64);
    for (int k = 0; k < used; ++k) r[rng() % kNumSymbols] = uint8_t(4 + rng() % (kMaxCodeLen - 3));
    CheckTablesAgree(r, "random ");
  }
}

TEST(over_subscribed_lengths_are_refused) {
  std::mt19937 rng(5);
  for (int t = 0; t < 1000; ++t) {
    Lens lens = Assign(CompleteDepths(2 + int(rng() % (kNumSymbols - 2)), t % 2 == 0, rng), rng);
    for (int s = 0; s < kNumSymbols; ++s)  // one more code of a random length
      if (!lens[s]) {
        lens[s] = uint8_t(1 + rng() % kMaxCodeLen);
        break;
      }
    CHECK(KraftSum(lens) > uint32_t(kTableSize));
    CheckTablesAgree(lens, "over-subscribed ");
  }
  Lens ones(kNumSymbols, 1);  // every symbol of length 1
  CheckTablesAgree(ones, "all length 1 ");
}

TEST(lengths_from_random_histograms) {
  // The lengths encoders write: BuildCodeLengths of skewed random histograms (many clamped to 11 bits).
  std::mt19937 rng(6);
  auto work = std::make_unique<HuffmanWork>();
  for (int t = 0; t < 2000; ++t) {
    uint32_t hist[kNumSymbols] = {0};
    const int used = 1 + int(rng() % kNumSymbols);
    for (int k = 0; k < used; ++k) hist[rng() % kNumSymbols] += 1u + (rng() >> (rng() % 32));
    Lens lens(kNumSymbols);
    BuildCodeLengths(hist, lens.data(), *work);
    CheckTablesAgree(lens, "histogram ");
  }
}

}  // namespace

ZIPCCL_TEST_MAIN
