"""PDF work after Chromium prints: finishing (PDF/A, invoices, stamps, encryption), joins."""
