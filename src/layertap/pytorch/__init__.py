"""PyTorch side: selectors resolved to hooks, capture, layer discovery, model specs."""
