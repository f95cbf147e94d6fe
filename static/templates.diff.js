// A line-based difference of two texts, for the template page: the longest common subsequence
// of their lines (after the common head and tail are set aside), drawn as added, removed and
// unchanged lines, with long unchanged runs folded to a few lines of context.

// Past this many cells (lines × lines) the middle is shown as removed then added, unmatched.
const MAX_CELLS = 4_000_000;
const CONTEXT = 3;

/** [{op: "same" | "added" | "removed", text, a, b}]: a and b are 1-based line numbers. */
export function diffLines(before, after) {
  const a = splitLines(before);
  const b = splitLines(after);
  let head = 0;
  while (head < a.length && head < b.length && a[head] === b[head]) head += 1;
  let tail = 0;
  while (tail < a.length - head && tail < b.length - head && a[a.length - 1 - tail] === b[b.length - 1 - tail]) tail += 1;
  const out = [];
  for (let i = 0; i < head; i += 1) out.push({ op: "same", text: a[i], a: i + 1, b: i + 1 });
  out.push(...middle(a.slice(head, a.length - tail), b.slice(head, b.length - tail), head));
  for (let k = tail; k > 0; k -= 1) {
    out.push({ op: "same", text: a[a.length - k], a: a.length - k + 1, b: b.length - k + 1 });
  }
  return out;
}

function splitLines(text) {
  if (text === null || text === undefined || text === "") return [];
  return String(text).replace(/\r\n?/g, "\n").split("\n");
}

function middle(a, b, offset) {
  const n = a.length;
  const m = b.length;
  const out = [];
  if (n * m > MAX_CELLS) {
    a.forEach((text, i) => out.push({ op: "removed", text, a: offset + i + 1, b: null }));
    b.forEach((text, j) => out.push({ op: "added", text, a: null, b: offset + j + 1 }));
    return out;
  }
  // lcs[i][j]: the longest common subsequence of a[i:] and b[j:], in one flat array.
  const width = m + 1;
  const lcs = new Uint32Array((n + 1) * width);
  for (let i = n - 1; i >= 0; i -= 1) {
    for (let j = m - 1; j >= 0; j -= 1) {
      lcs[i * width + j] = a[i] === b[j]
        ? lcs[(i + 1) * width + j + 1] + 1
        : Math.max(lcs[(i + 1) * width + j], lcs[i * width + j + 1]);
    }
  }
  let i = 0;
  let j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] === b[j]) {
      out.push({ op: "same", text: a[i], a: offset + i + 1, b: offset + j + 1 });
      i += 1;
      j += 1;
    } else if (i < n && (j === m || lcs[(i + 1) * width + j] >= lcs[i * width + j + 1])) {
      // A change shows what went before what came: the removed line first.
      out.push({ op: "removed", text: a[i], a: offset + i + 1, b: null });
      i += 1;
    } else {
      out.push({ op: "added", text: b[j], a: null, b: offset + j + 1 });
      j += 1;
    }
  }
  return out;
}

/** The lines as a list: changes in full, unchanged runs cut to CONTEXT lines around them. */
export function drawDiff(lines, label) {
  const list = document.createElement("ol");
  list.className = "diff";
  list.setAttribute("aria-label", label);
  const changed = lines.map((line) => line.op !== "same");
  const near = (index) => {
    for (let k = Math.max(0, index - CONTEXT); k <= Math.min(lines.length - 1, index + CONTEXT); k += 1) {
      if (changed[k]) return true;
    }
    return false;
  };
  let folded = 0;
  const flush = () => {
    if (!folded) return;
    const item = document.createElement("li");
    item.className = "line-fold";
    item.append(cellOf("ln", ""), cellOf("ln", ""), cellOf("mark", ""), cellOf("text", `… ${folded} unchanged line${folded === 1 ? "" : "s"}`));
    list.append(item);
    folded = 0;
  };
  lines.forEach((line, index) => {
    if (line.op === "same" && !near(index)) {
      folded += 1;
      return;
    }
    flush();
    const item = document.createElement("li");
    item.className = `line-${line.op}`;
    item.dataset.op = line.op;
    const mark = line.op === "added" ? "+" : line.op === "removed" ? "−" : "";
    item.append(cellOf("ln", line.a ?? ""), cellOf("ln", line.b ?? ""), cellOf("mark", mark), cellOf("text", line.text));
    if (line.op !== "same") item.setAttribute("aria-label", `${line.op}: ${line.text}`);
    list.append(item);
  });
  flush();
  return list;
}

function cellOf(className, text) {
  const span = document.createElement("span");
  span.className = className;
  span.textContent = String(text);
  return span;
}
