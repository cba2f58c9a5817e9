"""Shared pytest setup: make the top-level scripts importable and keep torch on few threads.

Run the whole suite with `python -m pytest -q tests`.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.set_num_threads(2)
