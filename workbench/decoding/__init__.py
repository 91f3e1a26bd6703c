"""From a model to text: greedy and beam search, the text-in text-out TranslationModel, scoring."""
