"""`GET /`: one static page to try the served models by hand.

Pick a model; for a model that takes images choose a JPEG/PNG (shown at once) and press
Run (sent as `/ui/models` says: {"b64": ...} to the signature taking encoded pictures, else
the browser's decoded uint8 pixels, resized to the export's fixed size if it has one, to
the one taking pixels: a LiteRT export, e.g.) to see its answer drawn by structure: boxes
(and masks) over the picture where the row has `<kind>_boxes`, else the five largest
`probabilities`; for a model that takes text type a sentence, press Run and see the
strings it answers. The picture is drawn at its displayed size (small ones at least 256
pixels wide, pixels kept sharp; large ones at most the page's width), boxes, masks and
labels over it at that size: thin lines and readable labels at any picture size. Only
the boxes whose score is at least the page's "Boxes with score >=" field are drawn and
listed (0.3; changing it redraws the last answer). The page holds no data: it
reads `/ui/models` and calls the REST API like any client, with the bearer token typed in
its field when the server has one. When an answer is shown, `<body data-done>` says which
kind ("classes", "boxes", "text" or "error"): what a test driving the page waits for.
"""

HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tpu-models serve</title>
<style>
 body{font-family:sans-serif;margin:1.5em;max-width:60em}
 #out{white-space:pre-wrap;font-family:monospace}
 canvas{border:1px solid #999;max-width:100%;image-rendering:pixelated}
 .row{margin:.5em 0}
</style></head><body>
<h1>tpu-models serve</h1>
<div class="row"><label>Model <select id="model"></select></label>
 <label>Token <input id="token" type="password" placeholder="(when the server has one)"></label></div>
<form id="ask" novalidate>
<div class="row" id="imagebox"><input id="file" type="file" accept="image/*">
 <label>Boxes with score &ge; <input id="threshold" type="number" min="0" max="1" step="0.05"
  value="0.3" style="width:5em"></label></div>
<div class="row" id="textbox"><textarea id="text" rows="3" cols="60">Guten Morgen</textarea></div>
<div class="row"><button id="run" type="submit">Run</button></div>
</form>
<div class="row"><canvas id="picture" width="1" height="1"></canvas></div>
<div id="out"></div>
<script>
const COLORS = ["#e6194b","#3cb44b","#4363d8","#f58231","#911eb4","#42d4f4","#f032e6","#bfef45"];
let models = [];
const $ = id => document.getElementById(id);
function headers() {
  const h = {"Content-Type": "application/json"};
  if ($("token").value) h["Authorization"] = "Bearer " + $("token").value;
  return h;
}
function pixels(img, height, width) {  // uint8 rows [H][W][3], resized to H x W when given.
  const h = height || img.naturalHeight, w = width || img.naturalWidth;
  const c = document.createElement("canvas"); c.width = w; c.height = h;
  const g = c.getContext("2d"); g.drawImage(img, 0, 0, w, h);
  const d = g.getImageData(0, 0, w, h).data, rows = [];
  for (let y = 0; y < h; y++) {
    const row = [];
    for (let x = 0; x < w; x++) { const i = 4 * (y * w + x); row.push([d[i], d[i + 1], d[i + 2]]); }
    rows.push(row);
  }
  return rows;
}
function pictureBody(send, url, img) {  // The :predict body of one picture, as /ui/models says.
  const value = send.as === "b64" ? {b64: url.split(",")[1]} : pixels(img, send.height, send.width);
  return {signature_name: send.signature, instances: [{[send.input]: value}]};
}
async function predict(name, body) {
  const r = await fetch("/v1/models/" + encodeURIComponent(name) + ":predict",
                        {method: "POST", headers: headers(), body: JSON.stringify(body)});
  const answer = await r.json();
  if (!r.ok) throw new Error(answer.error || r.statusText);
  return answer.predictions;
}
function chosen() { return models.find(m => m.name === $("model").value) || {}; }
function showInputs() {
  const text = chosen().input === "text";
  $("imagebox").style.display = text ? "none" : "";
  $("textbox").style.display = text ? "" : "none";
}
async function load() {
  const r = await fetch("/ui/models", {headers: headers()});
  const answer = await r.json();
  if (!r.ok) { $("out").textContent = "Error: " + answer.error; return; }
  models = answer.models;
  $("model").innerHTML = models.map(m =>
      `<option value="${m.name}">${m.name} (version ${m.version}, ${m.task})</option>`).join("");
  showInputs();
}
function show(img) {  // The picture on the canvas at its displayed size: [context, scale].
  // Small pictures are shown at least 256 wide, large ones at most the page's width; the
  // canvas holds as many pixels as are displayed (times the device's pixel ratio), so what
  // is drawn over the picture is sharp at any size. scale: displayed px per picture px.
  const c = $("picture"), room = Math.max(1, c.parentElement.clientWidth - 2);
  const width = Math.min(Math.max(256, img.naturalWidth), room);
  const scale = width / img.naturalWidth, height = Math.round(img.naturalHeight * scale);
  const ratio = window.devicePixelRatio || 1;
  c.style.width = width + "px"; c.style.height = height + "px";
  c.width = Math.round(width * ratio); c.height = Math.round(height * ratio);
  const g = c.getContext("2d");
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.imageSmoothingEnabled = scale < 1;  // Scaled up: each picture pixel a sharp block.
  g.drawImage(img, 0, 0, width, height);
  return [g, scale];
}
async function picture() {  // (data URL, loaded Image) of the chosen file, or null.
  const file = $("file").files[0]; if (!file) return null;
  const url = await new Promise(ok => { const f = new FileReader(); f.onload = () => ok(f.result); f.readAsDataURL(file); });
  const img = new Image(); await new Promise((ok, fail) => { img.onload = ok; img.onerror = () => fail(new Error("not a picture the browser can show")); img.src = url; });
  return [url, img];
}
function boxesKey(row) { return Object.keys(row).find(k => k.endsWith("_boxes")); }
function rgb(color) { return [1, 3, 5].map(i => parseInt(color.slice(i, i + 2), 16)); }
function maskPicture(m, height, width, color) {  // A canvas height x width: color where m is 1.
  const c = document.createElement("canvas"); c.width = width; c.height = height;
  const g = c.getContext("2d"), data = g.createImageData(width, height), [r, gr, b] = rgb(color);
  for (let y = 0; y < height; y++) for (let x = 0; x < width; x++) {
    if (!m[y][x]) continue;
    const i = 4 * (y * width + x);
    data.data[i] = r; data.data[i + 1] = gr; data.data[i + 2] = b; data.data[i + 3] = 255;
  }
  g.putImageData(data, 0, 0);
  return c;
}
function threshold() { const t = parseFloat($("threshold").value); return isNaN(t) ? 0.3 : t; }
function draw(img, row, frame) {
  // The boxes scoring at least the threshold, over the picture: masks (45% tint),
  // then boxes, then labels. Boxes are in the pixels of `frame` [H, W] (the picture's,
  // or the size its pixels were sent at); masks over the model's frame (its top-left
  // mask_content_size part is the picture) or, without mask_content_size, over the picture.
  const [g, scale] = show(img);
  const kind = boxesKey(row).slice(0, -"_boxes".length);
  const boxes = row[kind + "_boxes"], scores = row[kind + "_scores"],
        classes = row[kind + "_classes"], masks = row[kind + "_masks"],
        n = row["num_" + kind + "s"] ?? row["num_" + kind] ?? boxes.length,  // num_<kind>s
        least = threshold(), lines = [], shown = [];
  const width = img.naturalWidth * scale, height = img.naturalHeight * scale;
  const sy = height / frame[0], sx = width / frame[1];
  for (let i = n - 1; i >= 0; i--) if (scores[i] >= least) shown.push(i);  // Best drawn last.
  const color = i => COLORS[classes[i] % COLORS.length];
  if (masks) {
    g.imageSmoothingEnabled = false; g.globalAlpha = 0.45;
    for (const i of shown) {
      const [h, w] = row.mask_content_size || [masks[i].length, masks[i][0].length];
      g.drawImage(maskPicture(masks[i], h, w, color(i)), 0, 0, width, height);
    }
    g.globalAlpha = 1;
  }
  g.lineWidth = 3;
  for (const i of shown) {
    const [y0, x0, y1, x1] = boxes[i];
    g.strokeStyle = color(i); g.strokeRect(x0 * sx, y0 * sy, (x1 - x0) * sx, (y1 - y0) * sy);
  }
  g.font = "13px sans-serif"; g.textBaseline = "top";
  for (const i of shown) {  // Above the box, or inside it at the picture's top.
    const [y0, x0] = boxes[i], label = `${classes[i]} ${scores[i].toFixed(2)}`;
    const x = x0 * sx, y = y0 * sy >= 17 ? y0 * sy - 17 : y0 * sy;
    g.fillStyle = color(i); g.fillRect(x, y, g.measureText(label).width + 6, 17);
    g.fillStyle = "#fff"; g.fillText(label, x + 3, y + 2);
    const box = boxes[i].map(v => v.toFixed(1));
    lines.unshift(`class ${classes[i]} score ${scores[i].toFixed(3)} box [${box}]`);
  }
  return lines.length ? lines.join("\\n") : `nothing with score >= ${least}`;
}
let last = null;  // The last boxes answer: [picture, row, frame], redrawn on a new threshold.
function redraw() { if (last) $("out").textContent = draw(...last); }
async function onImage() {
  try {
    const chosenFile = await picture();
    if (!chosenFile) throw new Error("choose a picture first");
    const [url, img] = chosenFile, send = chosen().picture;
    if (!send) throw new Error("this model takes no pictures");
    const [row] = await predict(chosen().name, pictureBody(send, url, img));
    if (!row.valid && row.reason) throw new Error(row.reason);
    if (boxesKey(row)) {
      const frame = [img.naturalHeight, img.naturalWidth];  // The boxes' pixels: those sent.
      if (send.as === "pixels") frame.splice(0, 2, send.height || frame[0], send.width || frame[1]);
      last = [img, row, frame]; redraw(); document.body.dataset.done = "boxes"; return;
    }
    show(img);
    const top = row.probabilities.map((p, k) => [p, k]).sort((a, b) => b[0] - a[0]).slice(0, 5);
    $("out").textContent = top.map(([p, k]) => `class ${k}: ${p.toFixed(3)}`).join("\\n");
    document.body.dataset.done = "classes";
  } catch (e) { $("out").textContent = "Error: " + e.message; document.body.dataset.done = "error"; }
}
async function onText() {
  try {
    const [row] = await predict(chosen().name, {instances: [$("text").value]});
    $("out").textContent = Object.entries(row).map(([k, v]) => `${k}: ${v}`).join("\\n");
    document.body.dataset.done = "text";
  } catch (e) { $("out").textContent = "Error: " + e.message; document.body.dataset.done = "error"; }
}
async function onFile() {  // The chosen picture at once; its answer on Run.
  $("out").textContent = ""; delete document.body.dataset.done; last = null;
  try { const chosenFile = await picture(); if (chosenFile) show(chosenFile[1]); }
  catch (e) { $("out").textContent = "Error: " + e.message; }
}
$("ask").onsubmit = event => {
  event.preventDefault();
  $("out").textContent = "..."; delete document.body.dataset.done; last = null;
  if (chosen().input === "text") onText(); else onImage();
};
$("model").onchange = showInputs; $("file").onchange = onFile;
$("token").onchange = load; $("threshold").oninput = redraw;
load();
</script></body></html>
"""
