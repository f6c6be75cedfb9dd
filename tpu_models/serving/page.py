"""`GET /`: one static page to try the served models by hand.

Pick a model; for a model that takes images choose a JPEG/PNG (shown at once) and press
Run (sent as `/ui/models` says: {"b64": ...} to the signature taking encoded pictures, else
the browser's decoded uint8 pixels, resized to the export's fixed size if it has one, to
the one taking pixels: a LiteRT export, e.g.) to see its answer drawn by structure: boxes
(and masks) over the picture where the row has `<kind>_boxes`, else the five largest
`probabilities`; for a model that takes text type a sentence, press Run and see the
strings it answers. Pictures smaller than 256 pixels wide are shown scaled up (pixels
kept sharp). The page holds no data: it reads `/ui/models` and calls the REST API like
any client, with the bearer token typed in its field when the server has one. When an
answer is shown, `<body data-done>` says which kind ("classes", "boxes", "text" or
"error"): what a test driving the page waits for.
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
<form id="ask">
<div class="row" id="imagebox"><input id="file" type="file" accept="image/*"></div>
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
function show(img) {  // The picture on the canvas; small ones displayed at least 256 wide.
  const c = $("picture");
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  c.style.width = Math.max(256, img.naturalWidth) + "px";
  c.getContext("2d").drawImage(img, 0, 0);
  return c.getContext("2d");
}
async function picture() {  // (data URL, loaded Image) of the chosen file, or null.
  const file = $("file").files[0]; if (!file) return null;
  const url = await new Promise(ok => { const f = new FileReader(); f.onload = () => ok(f.result); f.readAsDataURL(file); });
  const img = new Image(); await new Promise((ok, fail) => { img.onload = ok; img.onerror = () => fail(new Error("not a picture the browser can show")); img.src = url; });
  return [url, img];
}
function boxesKey(row) { return Object.keys(row).find(k => k.endsWith("_boxes")); }
function draw(img, row) {
  const g = show(img);
  const kind = boxesKey(row).slice(0, -"_boxes".length);
  const boxes = row[kind + "_boxes"], scores = row[kind + "_scores"],
        classes = row[kind + "_classes"], masks = row[kind + "_masks"],
        n = row["num_" + kind], lines = [];
  for (let i = 0; i < n; i++) {
    if (scores[i] < 0.3) continue;
    const color = COLORS[classes[i] % COLORS.length];
    const [y0, x0, y1, x1] = boxes[i];
    if (masks && row.mask_content_size) {  // Over the model's frame: scaled to the picture.
      const [h, w] = row.mask_content_size, m = masks[i];
      const sy = img.naturalHeight / h, sx = img.naturalWidth / w;
      g.fillStyle = color; g.globalAlpha = 0.45;
      for (let y = 0; y < h; y++) for (let x = 0; x < w; x++)
        if (m[y][x]) g.fillRect(x * sx, y * sy, Math.ceil(sx), Math.ceil(sy));
      g.globalAlpha = 1;
    }
    g.strokeStyle = color; g.lineWidth = 3; g.strokeRect(x0, y0, x1 - x0, y1 - y0);
    g.fillStyle = color; g.font = "14px sans-serif";
    g.fillText(`${classes[i]} ${scores[i].toFixed(2)}`, x0 + 2, Math.max(12, y0 - 3));
    lines.push(`class ${classes[i]} score ${scores[i].toFixed(3)} box [${boxes[i].map(v => v.toFixed(1))}]`);
  }
  return lines.length ? lines.join("\\n") : "nothing with score >= 0.3";
}
async function onImage() {
  try {
    const chosenFile = await picture();
    if (!chosenFile) throw new Error("choose a picture first");
    const [url, img] = chosenFile, send = chosen().picture;
    if (!send) throw new Error("this model takes no pictures");
    const [row] = await predict(chosen().name, pictureBody(send, url, img));
    if (!row.valid && row.reason) throw new Error(row.reason);
    if (boxesKey(row)) { $("out").textContent = draw(img, row); document.body.dataset.done = "boxes"; return; }
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
  $("out").textContent = ""; delete document.body.dataset.done;
  try { const chosenFile = await picture(); if (chosenFile) show(chosenFile[1]); }
  catch (e) { $("out").textContent = "Error: " + e.message; }
}
$("ask").onsubmit = event => {
  event.preventDefault();
  $("out").textContent = "..."; delete document.body.dataset.done;
  if (chosen().input === "text") onText(); else onImage();
};
$("model").onchange = showInputs; $("file").onchange = onFile;
$("token").onchange = load;
load();
</script></body></html>
"""
