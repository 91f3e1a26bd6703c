"""How a model's attention and confidence change as it trains."""
