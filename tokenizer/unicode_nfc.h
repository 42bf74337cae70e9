// Unicode Normalization Form C (UAX #15) on UTF-8, with tables generated
// from the Unicode Character Database by tokenizer/gen_unicode_tables.py
// (version: unicode_version()). Used by HfTokenizer's NFC normalizer.
// Thread-safety: pure functions over constant tables.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvroute {

// Version of the Unicode data the tables were generated from, e.g. "15.0.0".
const char* unicode_version();

// True when s (valid UTF-8) is certainly already in NFC: no code point with
// NFC_QC No/Maybe and canonical combining classes in order. Pure ASCII and
// any text below U+0300 is answered by a byte scan. False means "maybe".
bool nfc_quick_check(std::string_view s);

// Writes the NFC form of s (valid UTF-8) to out (cleared first).
void nfc_normalize(std::string_view s, std::string& out);

// Per code point NFC properties (bits as in gen_unicode_tables.py): 0-7
// canonical combining class, 0x100 NFC_QC=No, 0x200 NFC_QC=Maybe, 0x400 has
// a canonical decomposition. 0 for code points NFC never changes alone.
uint16_t nfc_props(uint32_t cp);

}  // namespace kvroute
