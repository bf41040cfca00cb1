"""The Python bench's expert-block rows, their pure half (python/bench/block_rows.py): layers,
byte floor, targets, option parsing, table. No torch, no GPU, no nvfp4_gemm: runs anywhere, with
pytest or `python3 -m unittest` from python/tests."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import block_rows as br  # noqa: E402


class BlockRows(unittest.TestCase):
    def test_layers_and_bytes_match_the_rust_bench(self):
        self.assertEqual(list(br.LAYERS), ["ds", "qwen3", "mixtral"])
        self.assertEqual(br.LAYERS["ds"][1:], (256, 8, 7168, 2048))
        # bench/src/block.rs, layers_and_bytes: the same numbers.
        self.assertEqual(br.expert_bytes("ds"), 24_772_608)
        self.assertEqual(br.weight_bytes("ds"), 6_341_787_648)
        self.assertEqual(br.weight_bytes("qwen3"), 339_738_624)
        self.assertEqual(br.expert_bytes("mixtral"), 99_090_432)
        self.assertEqual(br.bf16_weight_bytes("ds"), 256 * 2 * 3 * 2048 * 7168)
        self.assertEqual(br.floor_bytes("ds", 1, 8), 8 * 24_772_608 + 2 * 2 * 7168)
        self.assertEqual(br.floor_bytes("mixtral", 4096, 8), 8 * 99_090_432 + 2 * 2 * 4096 * 4096)
        self.assertAlmostEqual(br.floor_us(1e9, 4.0), 250.0)
        self.assertEqual(br.matrix_bytes(130, 64), 130 * 32 + 256 * 4)
        self.assertAlmostEqual(br.weight_scale(64), 0.0625)

    def test_targets_by_token_count(self):
        t = br.targets(1, 0.8, 3.5, 0.6)
        self.assertEqual(t, {"floor": True, "torch": True, "unfused": True})
        self.assertEqual(br.targets(64, 0.74, 2.9, 0.76), {"floor": False, "torch": False, "unfused": False})
        self.assertEqual(br.targets(512, 0.9, 5.0, 0.5), {"floor": None, "torch": None, "unfused": None})
        self.assertEqual(br.targets(4096, 0.9, 1.1, 0.5), {"floor": None, "torch": True, "unfused": None})
        self.assertFalse(br.targets(4096, x_torch=1.09)["torch"])
        self.assertEqual(br.targets(8, 0.75), {"floor": True, "torch": None, "unfused": None})
        self.assertEqual([br.cell(True), br.cell(False), br.cell(None)], ["pass", "MISS", "-"])

    def test_options(self):
        self.assertEqual(br.selection(None, None, "all", False), (["ds", "qwen3", "mixtral"], [1, 8, 64, 512, 4096], ["w4a4", "w4a4-epilogue", "w4a16"]))
        self.assertEqual(br.selection(None, None, "w4a16", True), (["qwen3", "mixtral"], [1, 64, 4096], ["w4a16"]))
        self.assertEqual(br.selection("ds", "8", "w4a16,w4a4,w4a16", True), (["ds"], [8], ["w4a16", "w4a4"]))
        self.assertEqual(br.parse_layers("none"), [])
        self.assertEqual(br.parse_layers("mixtral, ds"), ["mixtral", "ds"])
        with self.assertRaisesRegex(ValueError, "unknown layer dsv3"):
            br.parse_layers("dsv3")
        with self.assertRaisesRegex(ValueError, "0 tokens: 1 to 16384"):
            br.parse_tokens("1,0")
        with self.assertRaisesRegex(ValueError, "`x` is not a whole number"):
            br.parse_tokens("x")
        with self.assertRaisesRegex(ValueError, "unknown precision `w4a8`"):
            br.parse_precisions("w4a8")

    def test_table_and_summary(self):
        row = {
            "tokens": 1,
            "touched": 8,
            "us": 6.64,
            "floor_us": 5.31,
            "of_floor": 0.8,
            "torch_us": 30.0,
            "x_torch": 30.0 / 6.64,
            "unfused_us": 12.0,
            "of_unfused": 6.64 / 12.0,
        }
        row["targets"] = br.targets(1, row["of_floor"], row["x_torch"], row["of_unfused"])
        big = {"tokens": 4096, "touched": 128, "us": 900.0, "floor_us": 100.0, "of_floor": 0.11, "torch_us": None, "x_torch": None, "unfused_us": None, "of_unfused": None}
        big["targets"] = br.targets(4096, big["of_floor"])
        runs = [{"name": "qwen3", "precision": "w4a4", "check": "PASS", "rows": [row, big]}]
        lines = br.table_rows(runs)
        self.assertEqual(len(lines[0]), len(br.HEADER))
        self.assertEqual(lines[0], ["qwen3", "w4a4", "PASS", "1", "8/128", "6.64", "5.31", "80%", "30.00", "4.52", "12.00", "0.553", "pass", "pass", "pass"])
        self.assertEqual(lines[1][8:], ["-", "-", "-", "-", "-", "-", "-"])
        self.assertEqual(br.target_summary(runs), {"floor": [1, 1], "torch": [1, 1], "unfused": [1, 1]})


if __name__ == "__main__":
    unittest.main()
