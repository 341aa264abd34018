// Records on the body element how many plots loaded, how wide the page is and where the summary sections start (the report test reads them).
window.addEventListener('load', function () {
  var imgs = document.querySelectorAll('img.plot'), n = 0;
  for (var i = 0; i < imgs.length; i++) { if (imgs[i].complete && imgs[i].naturalWidth > 0) n++; }
  document.body.dataset.plotsLoaded = String(n);
  document.body.dataset.plotsTotal = String(imgs.length);
  document.body.dataset.pageWidth = String(document.documentElement.scrollWidth);
  // Page y (px) of the summary sections.
  ['regressions', 'claims', 'summary'].forEach(function (id) {
    var el = document.getElementById(id);
    if (el) document.body.dataset[id + 'Top'] = String(Math.round(el.getBoundingClientRect().top + window.scrollY));
  });
  if (imgs.length) {
    var r = imgs[0].getBoundingClientRect();
    document.body.dataset.firstPlotRect = [r.left + window.scrollX, r.top + window.scrollY,
                                           r.width, r.height].map(Math.round).join(',');
  }
});
