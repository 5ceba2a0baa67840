// Renders the math that pymdownx.arithmatex (generic mode) leaves in `.arithmatex` elements, with the KaTeX files
// the site serves itself (assets/katex/, copied from Debian's libjs-katex at build time: no CDN).
function renderMath() {
  for (const element of document.querySelectorAll(".arithmatex")) {
    renderMathInElement(element, {
      delimiters: [
        { left: "\\(", right: "\\)", display: false },
        { left: "\\[", right: "\\]", display: true },
      ],
      throwOnError: false,
    });
  }
}

// Material's instant navigation swaps pages without a reload and announces each one on `document$`.
if (typeof document$ !== "undefined") {
  document$.subscribe(renderMath);
} else {
  document.addEventListener("DOMContentLoaded", renderMath);
}
