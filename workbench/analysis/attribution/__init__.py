"""Where an output comes from: gradients, decompositions, ALTI+, score splits and attribution graphs."""
