// The send page: content as name/value rows or as JSON. Switching carries what was
// typed across, so nothing is lost; the server reads whichever the radio says.
(function () {
  "use strict";
  function rows() { return document.getElementById("content-rows"); }
  function box() { return document.getElementById("id_content_json"); }

  function rowsToJson() {
    const content = {};
    rows().querySelectorAll("tbody tr").forEach(function (tr) {
      const inputs = tr.querySelectorAll("input");
      const name = inputs[0].value.trim();
      if (!name) return;
      const text = inputs[1].value.trim();
      let value = text;
      if (text === "true" || text === "false") value = text === "true";
      else if (text !== "" && !isNaN(Number(text))) value = Number(text);
      content[name] = value;
    });
    return JSON.stringify(content, null, 2);
  }

  function show(mode) {
    const json = mode === "json";
    if (json && !box().value.trim()) box().value = rowsToJson();
    rows().hidden = json;
    box().hidden = !json;
  }

  document.addEventListener("change", function (event) {
    if (event.target.matches && event.target.matches("input[name=content_mode]")) show(event.target.value);
  });
})();
