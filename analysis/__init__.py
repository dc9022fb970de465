"""fa4lab analysis: load result rows (load.py), the roofline model, figure functions and notebooks."""
