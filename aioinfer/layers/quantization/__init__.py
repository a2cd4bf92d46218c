"""Quantized weights: FP8 linear layers (config.py says which and how, fp8.py holds the numerics,
fp8_linear.py the layers' parameters, loading and products). Importing the package imports nothing."""
